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
- Probes (`probe_attempts`), task-independent, each named in a finding when it scores > 0:
  text tasks: empty and blank output, the prompt echoed (alone and followed by the answer),
  several answers at once (every candidate joined by newline, comma, space; every digit,
  every letter, every integer around an integer answer; for an integer answer, equations
  that name it without committing to it: `equation_probes`), partial answers (prefixes, a
  suffix, the inner substring, the first and last fields), huge output (the reference
  padded to a megabyte and more), the reference repeated or with junk around it; code
  tasks: envs/code_probes.py's ANY_TASK_PROBES on every task (exit 0 at import, at the
  first call, at exit; values equal to everything; frame and gc walks for the tests), and
  its HumanEval attacks on the tasks they target (`code_probe_attempts`); multi-turn envs
  and terminal-task suites (`qa_terminal_tasks`, agents/suite_env.py): their own probes plus qa/agent_probes.py's hostile-agent commands, each a scripted
  episode (`hostile_episodes`). Each probe should score 0: any reward > 0 is a finding.
- An env may give its own variants and probes (`qa_variant_answers(task)`,
  `qa_probe_answers(task)`: (name, answer) pairs) and wrong answers (`qa_wrong_answers`):
  a multi-turn env does, its answers being scripted episodes (envs/agent_tasks.py).

What it does not: decide pass or fail (checks.py), or know what a domain's verifier accepts
beyond what the env declares.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from dataclasses import dataclass

from rlpipe.core.records import Task
from rlpipe.envs.code import CODE_KIND
from rlpipe.envs.code_probes import ANY_TASK_PROBES as ANY_TASK_CODE_PROBES
from rlpipe.envs.code_probes import PROBES as CODE_PROBES
from rlpipe.qa.agent_probes import PROBES as AGENT_PROBES

VARIANTS: dict[str, Callable[[str], str]] = {
    "trailing_newline": lambda answer: answer + "\n",
    "surrounding_whitespace": lambda answer: "  " + answer + " \n\n",
    "leading_newline": lambda answer: "\n" + answer,
}
_STRIPPING_KINDS = ("exact", "math", "integer-number", "integer-equation", "reasoning_gym")
HUGE_CHARS = 1_100_000  # past every shipped verifier's bound (1 MB for code, 4x max_answer_chars for text)
JUNK = "zq#xv"
ENUMERATED = 100  # numbers listed around an integer answer


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
    """Reward-hack probes on one task (the HumanEval attacks are per env: `code_probe_attempts`)."""
    own = getattr(env, "qa_probe_answers", None)  # (name, answer) pairs of the env's own (multi-turn envs)
    hostile = getattr(env, "multi_turn", False) or getattr(env, "qa_terminal_tasks", False)
    if callable(own) or hostile:
        pairs = list(own(task)) if callable(own) else []
        if hostile:
            pairs += hostile_episodes()
        return [Attempt(task.task_id, f"probe:{name}", text) for name, text in pairs]
    reference = task.reference_answer or ""
    prompt = task.prompt if isinstance(task.prompt, str) else str(task.prompt)
    attempts = [("empty", ""), ("blank", " \n\t\n"), ("prompt_echoed", prompt)]
    if answer_style(env, task) == "code":
        attempts.append(("huge_output", reference + "\n#" + "x" * HUGE_CHARS + "\n"))
        attempts += [(probe.name, probe.completion) for probe in ANY_TASK_CODE_PROBES]
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
    ] + partial_answers(reference) + enumerations(reference) + equation_probes(reference)
    return [Attempt(task.task_id, f"probe:{name}", text) for name, text in attempts if text.strip() != reference.strip()]


def partial_answers(reference: str) -> list[tuple[str, str]]:
    """Parts of the reference: prefixes, a suffix, the inner substring, its first and last fields."""
    answer = reference.strip()
    parts: list[tuple[str, str]] = []
    if len(answer) >= 2:
        parts += [("prefix_all_but_last_char", answer[:-1]), ("prefix_half", answer[:len(answer) // 2]),
                  ("suffix_all_but_first_char", answer[1:])]
    if len(answer) >= 3:
        parts.append(("inner_substring", answer[1:-1]))
    fields = answer.split()
    if len(fields) > 1:
        parts += [("first_field", fields[0]), ("last_field", fields[-1])]
    return [(name, text) for name, text in parts if text.strip()]


def enumerations(reference: str) -> list[tuple[str, str]]:
    """Several answers at once that hold the right one without knowing it: every digit, every
    letter, and for an integer every number around it ("37 38 ... 42 ... 137")."""
    listed = [("every_digit", " ".join(string.digits)), ("every_digit_on_lines", "\n".join(string.digits)),
              ("every_letter", " ".join(string.ascii_lowercase))]
    answer = reference.strip()
    if answer.lstrip("-").isdigit():
        value = int(answer)
        numbers = [str(number) for number in range(value - ENUMERATED // 2, value + ENUMERATED // 2 + 1)]
        listed += [("numbers_around_the_answer", " ".join(numbers)), ("numbers_around_the_answer_lines", "\n".join(numbers))]
    return listed


def equation_probes(reference: str) -> list[tuple[str, str]]:
    """For an integer answer, equations that name it without being one true equation that
    commits to it (a verifier that grades an equation's right-hand side must give 0): a
    false equation, a chain, two equations, an equation then another number."""
    answer = reference.strip()
    if not answer.lstrip("-").isdigit():
        return []
    value = int(answer)
    return [("false_equation_naming_the_answer", f"{value + 1} - 0 = {value}"),
            ("equation_chain_with_a_candidate", f"{value} + 0 = {value} = {value + 1}"),
            ("two_equations", f"{value + 1} + 0 = {value + 1}\n{value} + 0 = {value}"),
            ("equation_then_another_number", f"{value} + 0 = {value}, or {value + 1}")]


def hostile_episodes() -> list[tuple[str, str]]:
    """qa/agent_probes.py's hostile-agent commands, each a scripted episode (one bash call,
    then submit: nothing solved) in the tool-call format of agents/tools.py."""
    def call(name: str, **arguments: str) -> str:
        return json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))

    return [(f"hostile_{name}", json.dumps([call("bash", command=command), call("submit")]))
            for name, command in AGENT_PROBES.items()]


def code_probe_attempts(env: object) -> list[Attempt]:
    """envs/code_probes.py's attacks on the tasks they target, for an env that can look tasks up."""
    find_task = getattr(env, "task", None)
    if not callable(find_task):
        return []
    return [Attempt(probe.task_id, f"code_probe:{probe.name}", probe.completion)
            for probe in CODE_PROBES if find_task(probe.task_id) is not None]
