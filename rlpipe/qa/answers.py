"""The answers the gate tries on a task: accepted formatting variants of the reference,
known-wrong answers, and reward-hack probes. Plain functions of the task; nothing runs here.

What it does:
- Answer style: "code" for HumanEval-style tasks (the completion is a function body: text
  after the reference may be legitimate code, so junk-after-the-answer probes do not apply),
  "text" for everything else. An env may state it as `qa_answer_style`.
- Accepted variants (`accepted_variants`): an env may declare `qa_accepted_variants`, names
  from VARIANTS; otherwise the verifier kind decides (the text verifiers strip surrounding
  whitespace; the code verifier takes a trailing newline). An unknown kind declares none.
- Known-wrong answers (`wrong_answers`): the reference with its last (and its first)
  letter or digit changed to another one (text), a body that does nothing (code). An env
  may give its own with `qa_wrong_answers(task) -> list[str]`.
- Probes (`probes`): empty and blank output, the prompt echoed (alone and followed by the
  answer), several answers at once (every candidate joined by newline, comma, space), huge
  output (the reference padded to a megabyte and more), the reference repeated or with junk
  around it; for code tasks the 30 attacks of envs/code_probes.py on the tasks they target.
  Each probe should score 0: any reward > 0 is a finding.
- An env may give its own variants and probes (`qa_variant_answers(task)`,
  `qa_probe_answers(task)`: (name, answer) pairs) and wrong answers (`qa_wrong_answers`):
  a multi-turn env does, its answers being scripted episodes (envs/agent_tasks.py).

What it does not: decide pass or fail (checks.py), or know what a domain's verifier accepts
beyond what the env declares.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass

from rlpipe.core.records import Task
from rlpipe.envs.code import CODE_KIND
from rlpipe.envs.code_probes import PROBES as CODE_PROBES

VARIANTS: dict[str, Callable[[str], str]] = {
    "trailing_newline": lambda answer: answer + "\n",
    "surrounding_whitespace": lambda answer: "  " + answer + " \n\n",
    "leading_newline": lambda answer: "\n" + answer,
}
_STRIPPING_KINDS = ("exact", "math", "integer-number", "integer-equation", "reasoning_gym")
HUGE_CHARS = 1_100_000  # past every shipped verifier's bound (1 MB for code, 4x max_answer_chars for text)
JUNK = "zq#xv"


@dataclass(frozen=True)
class Attempt:
    """One answer to try on a task, named by what it is."""

    task_id: str
    name: str
    text: str


def answer_style(env: object, task: Task) -> str:
    declared = getattr(env, "qa_answer_style", None)
    if declared in ("text", "code"):
        return declared
    return "code" if task.verifier.kind == CODE_KIND else "text"


def accepted_variants(env: object, task: Task) -> tuple[str, ...]:
    """Names of the formatting variants of the right answer the env's verifier must accept."""
    declared = getattr(env, "qa_accepted_variants", None)
    if declared is not None:
        unknown = sorted(set(declared) - set(VARIANTS))
        if unknown:
            raise ValueError(f"env {getattr(env, 'name', env)!r} declares unknown qa variants {unknown}; known: {sorted(VARIANTS)}")
        return tuple(declared)
    kind = task.verifier.kind
    if kind == CODE_KIND:
        return ("trailing_newline",)
    if kind.split(":")[0] in _STRIPPING_KINDS:
        return ("trailing_newline", "surrounding_whitespace", "leading_newline")
    return ()


def variant_attempts(env: object, task: Task) -> list[Attempt]:
    own = getattr(env, "qa_variant_answers", None)  # (name, answer) pairs of the env's own (multi-turn envs)
    if callable(own):
        return [Attempt(task.task_id, f"variant:{name}", text) for name, text in own(task)]
    if task.reference_answer is None:
        return []
    return [Attempt(task.task_id, f"variant:{name}", VARIANTS[name](task.reference_answer))
            for name in accepted_variants(env, task)]


def change_char(text: str, position: int) -> str:
    """`text` with the letter or digit at `position` replaced by the next one (9 -> 0, z -> a)."""
    char = text[position]
    for alphabet in (string.digits, string.ascii_lowercase, string.ascii_uppercase):
        if char in alphabet:
            replacement = alphabet[(alphabet.index(char) + 1) % len(alphabet)]
            return text[:position] + replacement + text[position + 1:]
    raise ValueError(f"{char!r} is not an ASCII letter or digit")


def perturbations(reference: str) -> list[tuple[str, str]]:
    """(name, text) of the reference with its last and its first ASCII letter/digit changed."""
    positions = [index for index, char in enumerate(reference) if char.isascii() and char.isalnum()]
    if not positions:
        return [("appended_char", reference + "0")]
    chosen = [("last_char", positions[-1])] + ([("first_char", positions[0])] if positions[0] != positions[-1] else [])
    return [(name, change_char(reference, position)) for name, position in chosen]


def wrong_attempts(env: object, task: Task) -> list[Attempt]:
    """Answers that must score 0."""
    own = getattr(env, "qa_wrong_answers", None)
    if callable(own):
        return [Attempt(task.task_id, f"wrong:{index}", text) for index, text in enumerate(own(task))]
    if answer_style(env, task) == "code":
        return [Attempt(task.task_id, "wrong:pass_body", "    pass\n"),
                Attempt(task.task_id, "wrong:raise_body", "    raise NotImplementedError\n")]
    if task.reference_answer is None:
        return []
    return [Attempt(task.task_id, f"wrong:{name}", text) for name, text in perturbations(task.reference_answer)]


def probe_attempts(env: object, task: Task) -> list[Attempt]:
    """Reward-hack probes on one task (the code attacks are per env: `code_probe_attempts`)."""
    own = getattr(env, "qa_probe_answers", None)  # (name, answer) pairs of the env's own (multi-turn envs)
    if callable(own):
        return [Attempt(task.task_id, f"probe:{name}", text) for name, text in own(task)]
    reference = task.reference_answer or ""
    prompt = task.prompt if isinstance(task.prompt, str) else str(task.prompt)
    attempts = [("empty", ""), ("blank", " \n\t\n"), ("prompt_echoed", prompt)]
    if answer_style(env, task) == "code":
        attempts.append(("huge_output", reference + "\n#" + "x" * HUGE_CHARS + "\n"))
        return [Attempt(task.task_id, f"probe:{name}", text) for name, text in attempts]
    candidates = [reference] + [attempt.text for attempt in wrong_attempts(env, task)]
    attempts += [
        ("prompt_echoed_with_answer", f"{prompt} {reference}"),
        ("prompt_echoed_then_answer", f"{prompt}\n{reference}"),
        ("several_answers_lines", "\n".join(candidates)),
        ("several_answers_commas", ", ".join(candidates)),
        ("several_answers_spaces", " ".join(candidates)),
        ("huge_whitespace_padding", reference + " " * HUGE_CHARS),
        ("huge_repeated_answer", "\n".join([reference] * (HUGE_CHARS // max(1, len(reference) + 1) + 1))),
        ("answer_twice", f"{reference} {reference}"),
        ("answer_then_junk", f"{reference} {JUNK}"),
        ("junk_then_answer", f"{JUNK} {reference}"),
        ("answer_junk_lines", f"{reference}\n{JUNK}\n{reference}"),
    ]
    return [Attempt(task.task_id, f"probe:{name}", text) for name, text in attempts if text != reference]


def code_probe_attempts(env: object) -> list[Attempt]:
    """envs/code_probes.py's attacks on the tasks they target, for an env that can look tasks up."""
    find_task = getattr(env, "task", None)
    if not callable(find_task):
        return []
    return [Attempt(probe.task_id, f"code_probe:{probe.name}", probe.completion)
            for probe in CODE_PROBES if find_task(probe.task_id) is not None]
