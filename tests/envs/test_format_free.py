"""The format-free scorer (envs/format_free.py): the last number of a reply against a task's
numeric answer, whatever words or equation surround it; no score for non-numeric answers."""

import pytest

from rlpipe.core.records import Task, VerifierSpec
from rlpipe.envs.format_free import format_free_passed, last_number, numeric_answer, parse_number


def _task(answer: str | None) -> Task:
    return Task(task_id="t", domain="d", prompt="p", verifier=VerifierSpec(kind="k", payload="{}"), reference_answer=answer)


@pytest.mark.parametrize(("text", "expected"), [
    ("The answer is 42.", 42.0),
    ("3 + 4 = 7", 7.0),
    ("10-3=7", 7.0),
    ("5 - 8 = -3", -3.0),
    ("x=-2", -2.0),
    ("Total: 1,234 apples", 1234.0),
    ("It costs 2.5 dollars", 2.5),
    ("first 12, then 13", 13.0),
    ("no digits here", None),
    ("", None),
])
def test_last_number_of_a_reply(text, expected):
    assert last_number(text) == expected


def test_a_numeric_reference_answer_is_read_and_others_are_not():
    assert numeric_answer(_task("288")) == 288.0
    assert numeric_answer(_task("-7")) == -7.0
    assert numeric_answer(_task("45 + 60 = 105")) is None
    assert numeric_answer(_task("olleh")) is None
    assert numeric_answer(_task(None)) is None
    assert parse_number(" 3.50 ") == 3.5


def test_format_free_passes_on_the_right_last_number_only():
    task = _task("105")
    assert format_free_passed(task, "45 + 60 = 105")
    assert format_free_passed(task, "Sure! The sum is 105.0")
    assert not format_free_passed(task, "105 is wrong, it is 106")
    assert not format_free_passed(task, "I cannot compute that")
    assert format_free_passed(_task("hello"), "hello") is None
