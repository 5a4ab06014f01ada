"""The format-free score of a reply: is the LAST number in it the task's numeric answer?

What it does:
- `numeric_answer(task)` reads a task's reference answer as a number (integers, decimals,
  a leading sign, thousands commas); None when the answer is not a number (a word, an
  equation, code): such a domain has no format-free score.
- `last_number(text)` finds the last number written in a reply ("... so 3 + 4 = 7." -> 7).
- `format_free_passed(task, text)` is True iff the reply's last number equals the numeric
  answer, None when the task has no numeric answer.

It sits beside a domain's strict verdict (the domain's own verifier on the whole reply) in
every held-out evaluation, so that a gain of format (the reply reshaped to what the strict
verifier parses) is told apart from a gain of skill (the right number, however it is said).

What it does not: reward anything (training uses the strict verifier only), read answers
out of tags, fractions, words ("seven") or scientific notation, or grade units.
"""

from __future__ import annotations

import math
import re

from rlpipe.core.records import Task

_NUMBER = re.compile(r"(?<![\w.])[-−]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|(?<![\w.])[-−]?\d+(?:\.\d+)?")
_MAX_SCANNED_CHARS = 20_000  # a reply longer than this is scored on its tail only


def parse_number(text: str) -> float | None:
    """`text` (stripped) as one number, or None when it is anything else."""
    match = _NUMBER.fullmatch(text.strip())
    return _as_float(match.group(0)) if match else None


def last_number(text: str) -> float | None:
    """The last number written in `text`, or None when it holds none."""
    found = _NUMBER.findall(text[-_MAX_SCANNED_CHARS:])
    return _as_float(found[-1]) if found else None


def numeric_answer(task: Task) -> float | None:
    """The task's reference answer as a number; None when it is not one (or there is none)."""
    return parse_number(task.reference_answer) if task.reference_answer is not None else None


def format_free_passed(task: Task, text: str) -> bool | None:
    """True iff the reply's last number equals the task's numeric answer; None when the
    task's answer is not a number (the domain has no format-free score)."""
    expected = numeric_answer(task)
    if expected is None:
        return None
    got = last_number(text)
    return got is not None and math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9)


def _as_float(number: str) -> float:
    return float(number.replace(",", "").replace("−", "-"))
