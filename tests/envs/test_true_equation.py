"""The equation answer format: one true arithmetic equation is graded on its right-hand
side, and nothing else a reply can write earns more than the bare answer would."""

from __future__ import annotations

import pytest

from rlpipe.core.records import VerdictReason
from rlpipe.envs.reasoning_gym_env import ReasoningGymEnv
from rlpipe.envs.true_equation import equation_answer

SUMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+", "-"],
        "allow_parentheses": False, "allow_negation": False}


@pytest.mark.parametrize(("reply", "answer"), [
    ("4 - 1 = 3", "3"), (" 4 - 1 = 3. ", "3"), ("(2 + 3) * 4 = 20", "20"), ("10 × 14 = 140", "140"),
    ("-4 + 0 = -4", "-4"), ("7 = 7", "7"),
])
def test_a_true_equation_yields_its_right_hand_side(reply: str, answer: str) -> None:
    assert equation_answer(reply) == answer


@pytest.mark.parametrize("reply", [
    "10 + 7 = 8",  # false
    "3",  # no equation
    "18 + 20 = 38 = 38",  # a chain
    "1 + 1 = 2 and 3",  # words after it
    "118 119 = 218",  # candidates side by side are no expression
    "2**3 = 8", "9**9**9 = 1",  # powers are refused before any evaluation
    "1e3 = 1000", "0x10 = 16", "8 / 2 = 4", "2.5 * 2 = 5",
    "(" * 300 + "1" + ")" * 300 + " = 1",  # over the length bound
    "",
])
def test_anything_else_yields_none(reply: str) -> None:
    assert equation_answer(reply) is None


def test_the_env_grades_the_right_hand_side_only_when_asked() -> None:
    bare = ReasoningGymEnv("sums", "basic_arithmetic", SUMS)
    equation = ReasoningGymEnv("sums", "basic_arithmetic", SUMS, answer_format="equation")
    task = equation.tasks("train", 1, seed=0)[0]
    expression = task.prompt.removeprefix("Calculate ").removesuffix(".")
    answer = task.reference_answer
    right = f"{expression} = {answer}"
    assert equation.verify(task, right).reward == 1.0
    assert equation.verify(task, answer).reward == 1.0  # the bare answer still counts
    assert bare.verify(task, right).reward == 0.0
    assert bare.verifier_version != equation.verifier_version
    wrong = str(int(answer) + 1)
    for hack in (f"{expression} = {wrong}",  # a false equation naming a wrong number
                 f"{expression} = {answer} = {answer}", f"{answer} {answer}", f"{wrong} {answer}",
                 f"{expression} = {wrong} so {answer}", f"0 + {wrong} = {wrong}"):
        verdict = equation.verify(task, hack)
        assert (verdict.reward, verdict.passed) == (0.0, False), hack
        assert verdict.reason in (VerdictReason.WRONG, VerdictReason.FORMAT), hack


def test_an_unknown_answer_format_is_refused() -> None:
    with pytest.raises(ValueError, match="answer_format"):
        ReasoningGymEnv("sums", "basic_arithmetic", SUMS, answer_format="latex")
