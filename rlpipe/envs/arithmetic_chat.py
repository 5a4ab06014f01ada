"""The chat arithmetic domains for instruct models (model.prompt_format = "chat"):
- arithmetic_chat: "What is 348 + 275? Answer with only the number." -> exactly "623";
- arithmetic_chat_equation: "What is 348 + 275? Answer with only the equation, like
  1 + 2 = 3." -> exactly "348 + 275 = 623".
SmolLM2-135M-Instruct out of the box gets the sum wrong ("17 + 25 = 32") or explains
instead of answering; it answers in the equation's shape on its own, never as a bare number.

What it does:
- Problems are `a <op> b` with both operands in [min_operand, max_operand] (10..999 gives
  two- and three-digit operands) and operators from `operations` (+, -, *; a - b may be
  negative). Each problem belongs to train or held-out by a hash of its canonical key
  ("348+275"), as in envs/arithmetic.py, so the splits are disjoint for every seed and size.
  Small spaces are enumerated; large ones (10..999: ~980k problems per operator) are drawn
  by seeded rejection sampling of distinct problems, without listing them.
- `verify_equation_answer` accepts exactly "a op b = n" with canonical integers, single
  spaces, the question's operands in its order, and the right n; another true or false
  equation is wrong, anything else (prose, a bare number, "=" unspaced, several equations,
  a trailing full stop) is format. The other rules are those of `verify_integer_answer`.
- `verify_integer_answer` accepts exactly one canonical integer (optional "-", no leading
  zeros, no "+", no "-0") surrounded by nothing but whitespace, and rewards it 1.0 iff it
  equals the expected value. Everything else is format (0.0): prose around the number,
  several numbers, the question echoed, "623.", "6,23", "623.0", "<answer>623</answer>",
  fullwidth digits, empty or over-long output (checked before any stripping, so a megabyte
  costs nothing). A verdict's detail is at most DETAIL_CHARS characters. It never raises.

What it does not: parse words ("six hundred"), normalise Unicode, or read chains of thought.
"""

from __future__ import annotations

import random
import re
import sys
import time
from typing import Literal

from rlpipe.core.records import Task, Verdict, VerdictReason, VerifierSpec
from rlpipe.envs import exact
from rlpipe.envs.exact import DETAIL_CHARS, check_split, draw_from_pool, in_heldout, source_version
from rlpipe.sandbox.base import Sandbox

INTEGER_KIND = "integer"
MAX_ANSWER_CHARS = 64
ENUMERATE_LIMIT = 50_000  # problem spaces up to this size are listed; larger ones are sampled
_CANONICAL_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")
_EQUATION = re.compile(r"-?(?:0|[1-9][0-9]*) [+*-] -?(?:0|[1-9][0-9]*) = -?(?:0|[1-9][0-9]*)")
AnswerFormat = Literal["number", "equation"]
_INSTRUCTIONS = {"number": "Answer with only the number.", "equation": "Answer with only the equation, like 1 + 2 = 3."}
_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
Problem = tuple[int, str, int]


def verify_integer_answer(completion_text: str, expected: str, verifier_version: str) -> Verdict:
    """Reward 1.0 iff the completion is exactly the integer `expected` (whitespace around it
    allowed); see the module docstring for what counts as format."""
    return _verdict(completion_text, expected, verifier_version, _CANONICAL_INTEGER, "an integer")


def verify_equation_answer(completion_text: str, expected: str, verifier_version: str) -> Verdict:
    """Reward 1.0 iff the completion is exactly the equation `expected` ("17 + 25 = 42", the
    question's operands in its order; whitespace around it allowed). Another well-formed
    equation ("25 + 17 = 42", "17 + 25 = 41") is wrong; anything else is format."""
    return _verdict(completion_text, expected, verifier_version, _EQUATION, "an equation 'a + b = n'")


def _verdict(completion_text: str, expected: str, verifier_version: str, form: re.Pattern, form_name: str) -> Verdict:
    started = time.perf_counter()
    try:
        reason, detail = _judge(completion_text, expected, form, form_name)
    except Exception as exc:  # a verifier never raises for model output
        reason, detail = VerdictReason.FORMAT, f"unreadable output: {type(exc).__name__}"
    passed = reason is VerdictReason.OK
    return Verdict(reward=1.0 if passed else 0.0, passed=passed, reason=reason, detail=detail[:DETAIL_CHARS],
                   duration_s=time.perf_counter() - started, verifier_version=verifier_version)


def _judge(completion_text: str, expected: str, form: re.Pattern, form_name: str) -> tuple[VerdictReason, str]:
    text = completion_text if isinstance(completion_text, str) else str(completion_text)
    if len(text) > 4 * MAX_ANSWER_CHARS:  # never strip or scan a huge output
        return VerdictReason.FORMAT, f"output too long: {len(text)} chars"
    answer = text.strip()
    if not answer:
        return VerdictReason.FORMAT, "empty output"
    if not answer.isascii() or form.fullmatch(answer) is None or re.search(r"(?<![0-9])-0(?![0-9])", answer):
        return VerdictReason.FORMAT, f"expected only {form_name}, got {_preview(answer)}"
    if answer == expected:
        return VerdictReason.OK, "ok"
    return VerdictReason.WRONG, f"expected {expected}, got {answer}"


def _preview(text: str, chars: int = 80) -> str:
    return repr(text[:chars]) + ("..." if len(text) > chars else "")


class ArithmeticChatEnv:
    """Two- and three-digit arithmetic asked in English, answered with a bare integer
    (answer_format "number") or the equation (answer_format "equation")."""

    name = "arithmetic_chat"
    needs_sandbox = False

    def __init__(self, max_operand: int = 999, min_operand: int = 10, operations: str = "+",
                 heldout_fraction: float = 0.2, answer_format: AnswerFormat = "number") -> None:
        if answer_format not in _INSTRUCTIONS:
            raise ValueError(f"answer_format must be one of {sorted(_INSTRUCTIONS)}, got {answer_format!r}")
        if not 0 <= min_operand <= max_operand:
            raise ValueError(f"operands must satisfy 0 <= min_operand <= max_operand, got {min_operand}..{max_operand}")
        if not operations or any(op not in _APPLY for op in operations):
            raise ValueError(f"operations must be a non-empty string of {''.join(_APPLY)}, got {operations!r}")
        if not 0 < heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        self.min_operand, self.max_operand = min_operand, max_operand
        self.operations = "".join(dict.fromkeys(operations))
        self.heldout_fraction = heldout_fraction
        self.answer_format = answer_format
        self.verifier_version = source_version(
            (exact, sys.modules[__name__]),
            (("min_operand", min_operand), ("max_operand", max_operand), ("operations", self.operations),
             ("heldout_fraction", heldout_fraction), ("answer_format", answer_format)),
        )
        span = max_operand - min_operand + 1
        self._space_size = len(self.operations) * span * span
        self._listed: dict[str, list[Problem]] | None = None
        if self._space_size <= ENUMERATE_LIMIT:
            operands = range(min_operand, max_operand + 1)
            self._listed = {"train": [], "heldout": []}
            for problem in ((a, op, b) for op in self.operations for a in operands for b in operands):
                self._listed[self._split_of(problem)].append(problem)

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        """`count` seeded tasks of the split: distinct while the split has enough (a listed
        split then repeats; a sampled one has hundreds of thousands of problems)."""
        check_split(split)
        rng = random.Random(f"{self.name}:{split}:{seed}")
        if self._listed is not None:
            pool = self._listed[split]
            if not pool:
                raise ValueError(f"the {split} split of {self.name} is empty; widen min_operand..max_operand")
            chosen = draw_from_pool(pool, count, rng)
        else:
            chosen = self._sample_distinct(split, count, rng)
        return [self._task(problem, split) for problem in chosen]

    def verify(self, task: Task, completion_text: str, sandbox: Sandbox | None = None) -> Verdict:
        if self.answer_format == "equation":
            return verify_equation_answer(completion_text, task.verifier.payload, self.verifier_version)
        return verify_integer_answer(completion_text, task.verifier.payload, self.verifier_version)

    def _sample_distinct(self, split: str, count: int, rng: random.Random) -> list[Problem]:
        if count > self._space_size // 4:  # rejection sampling would crawl; such counts are not used
            raise ValueError(f"{count} tasks is too many for {self._space_size} problems; lower the count")
        seen: set[Problem] = set()
        chosen: list[Problem] = []
        while len(chosen) < count:
            problem = (rng.randint(self.min_operand, self.max_operand), rng.choice(self.operations),
                       rng.randint(self.min_operand, self.max_operand))
            if problem not in seen and self._split_of(problem) == split:
                seen.add(problem)
                chosen.append(problem)
        return chosen

    def _split_of(self, problem: Problem) -> str:
        a, op, b = problem
        return "heldout" if in_heldout(f"{a}{op}{b}", self.heldout_fraction) else "train"

    def _task(self, problem: Problem, split: str) -> Task:
        a, op, b = problem
        answer = str(_APPLY[op](a, b))
        if self.answer_format == "equation":
            answer = f"{a} {op} {b} = {answer}"
        return Task(
            task_id=f"{self.name}/{a}{op}{b}",
            domain=self.name,
            prompt=f"What is {a} {op} {b}? {_INSTRUCTIONS[self.answer_format]}",
            verifier=VerifierSpec(kind=f"{INTEGER_KIND}-{self.answer_format}", payload=answer),
            reference_answer=answer,
            metadata=(("split", split),),
        )


class ArithmeticChatEquationEnv(ArithmeticChatEnv):
    """`ArithmeticChatEnv` answered as the equation: "What is 17 + 25? Answer with only the
    equation, like 1 + 2 = 3." -> "17 + 25 = 42". SmolLM2-135M-Instruct already answers in this
    shape (and gets the sum wrong), so RL starts from a format it can hit."""

    name = "arithmetic_chat_equation"

    def __init__(self, max_operand: int = 999, min_operand: int = 10, operations: str = "+",
                 heldout_fraction: float = 0.2) -> None:
        super().__init__(max_operand, min_operand, operations, heldout_fraction, answer_format="equation")
