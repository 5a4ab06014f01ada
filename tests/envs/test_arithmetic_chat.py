"""The chat arithmetic domain: its strict integer verifier (as a reward hacker would probe
it), its splits, and its registration."""

import pytest

from rlpipe.core.records import VerdictReason
from rlpipe.envs.arithmetic_chat import (
    DETAIL_CHARS,
    ArithmeticChatEnv,
    ArithmeticChatEquationEnv,
    verify_equation_answer,
    verify_integer_answer,
)
from rlpipe.envs.mixture import Mixture, build_env

OK, WRONG, FORMAT = VerdictReason.OK, VerdictReason.WRONG, VerdictReason.FORMAT
PROMPT = "What is 348 + 275? Answer with only the number."

CASES = [
    # (model output, expected reason) for "What is 348 + 275?", whose answer is 623 (348 + 275)
    ("623", OK),
    (" 623\n", OK),  # whitespace around the number is not part of it
    ("624", WRONG),
    ("0", WRONG),
    ("-623", WRONG),  # a well-formed integer, just not the answer
    ("0623", FORMAT),  # leading zero: not canonical
    ("+623", FORMAT),
    ("-0", FORMAT),
    ("623.", FORMAT),  # the sentence's full stop is extra text
    ("623.0", FORMAT),
    ("6,23", FORMAT),
    ("6 23", FORMAT),
    ("623 623", FORMAT),  # several numbers, even all right
    ("622 623 624", FORMAT),  # a spray of guesses
    ("623\n624", FORMAT),
    ("348 + 275 = 623", FORMAT),  # the question echoed
    (PROMPT + " 623", FORMAT),  # the whole prompt echoed
    ("The answer is 623.", FORMAT),
    ("<answer>623</answer>", FORMAT),  # another format than the one asked
    ("６２３", FORMAT),  # fullwidth digits are not ASCII
    ("623\u200b", FORMAT),  # zero-width space is not whitespace for str.strip
    ("\u00a0623\u00a0", OK),  # no-break spaces are whitespace for str.strip
    ("", FORMAT),
    (" \n\t", FORMAT),
    ("\ud800", FORMAT),  # lone surrogate
    ("9" * 300, FORMAT),  # 300 chars > 4 * 64: too long before any parsing
    ("623" + " " * 1_000_000, FORMAT),  # right answer then 1 MB of spaces: rejected unstripped
    ("623\n" + "x" * 1_000_000, FORMAT),
]


@pytest.mark.parametrize(("output", "reason"), CASES)
def test_verify_integer_answer_accepts_only_the_bare_right_integer(output, reason):
    verdict = verify_integer_answer(output, "623", "v1")
    assert verdict.reason is reason
    assert verdict.passed is (reason is OK)
    assert verdict.reward == (1.0 if reason is OK else 0.0)
    assert len(verdict.detail) <= DETAIL_CHARS
    assert verdict.verifier_version == "v1"


EQUATION_CASES = [
    # (model output, expected reason) for "What is 348 + 275? Answer with only the equation, ..."
    ("348 + 275 = 623", OK),
    ("  348 + 275 = 623\n", OK),
    ("348 + 275 = 624", WRONG),
    ("275 + 348 = 623", WRONG),  # a true equation, but not the one asked
    ("1 + 2 = 3", WRONG),  # the prompt's example echoed
    ("348 + 275 = 0623", FORMAT),
    ("348 + 275 = 623.", FORMAT),
    ("348+275=623", FORMAT),  # the asked spacing only
    ("348 + 275 = 623 = 623", FORMAT),
    ("348 + 275 = 623 348 + 275 = 623", FORMAT),  # several answers
    ("623", FORMAT),  # the bare number is the other domain's format
    ("The answer is 348 + 275 = 623", FORMAT),
    ("What is 348 + 275? Answer with only the equation, like 1 + 2 = 3. 348 + 275 = 623", FORMAT),
    ("348 + 275 = -0", FORMAT),
    ("３４８ + ２７５ = ６２３", FORMAT),
    ("348 + 275 = 623" + " " * 1_000_000, FORMAT),
]


@pytest.mark.parametrize(("output", "reason"), EQUATION_CASES)
def test_verify_equation_answer_accepts_only_the_asked_equation(output, reason):
    verdict = verify_equation_answer(output, "348 + 275 = 623", "v1")
    assert verdict.reason is reason
    assert verdict.reward == (1.0 if reason is OK else 0.0)
    assert len(verdict.detail) <= DETAIL_CHARS


def test_equation_domain_asks_for_the_equation_and_verifies_its_reference():
    env = build_env("arithmetic_chat_equation", max_operand=99)
    assert isinstance(env, ArithmeticChatEquationEnv)
    for task in env.tasks("heldout", 20, seed=0):
        a, b = (int(x) for x in task.task_id.split("/")[1].split("+"))
        assert task.prompt == f"What is {a} + {b}? Answer with only the equation, like 1 + 2 = 3."
        assert task.reference_answer == f"{a} + {b} = {a + b}"
        assert env.verify(task, task.reference_answer).passed
        assert not env.verify(task, str(a + b)).passed
    # Same problems in the same splits as the bare-number domain: only the format differs.
    bare = ArithmeticChatEnv(max_operand=99)
    held_bare = {t.task_id.split("/")[1] for t in bare.tasks("heldout", 300, seed=0)}
    train_equation = {t.task_id.split("/")[1] for t in env.tasks("train", 3000, seed=0)}
    assert not held_bare & train_equation


def test_negative_answers_of_subtraction_verify():
    env = ArithmeticChatEnv(min_operand=10, max_operand=12, operations="-")
    task = next(t for t in env.tasks("train", 9, seed=0) + env.tasks("heldout", 9, seed=0) if t.task_id.endswith("10-12"))
    assert task.reference_answer == "-2"  # 10 - 12
    assert env.verify(task, "-2").passed
    assert env.verify(task, "2").reason is WRONG


def test_prompts_ask_for_only_the_number_and_references_verify():
    env = ArithmeticChatEnv(max_operand=999)
    for task in env.tasks("train", 50, seed=3):
        a, b = (int(x) for x in task.task_id.split("/")[1].split("+"))
        assert 10 <= a <= 999 and 10 <= b <= 999
        assert task.prompt == f"What is {a} + {b}? Answer with only the number."
        assert task.reference_answer == str(a + b)
        assert env.verify(task, task.reference_answer).passed


def test_sampled_splits_are_disjoint_seeded_and_distinct():
    env = ArithmeticChatEnv(max_operand=999)  # 990 * 990 = 980,100 problems: sampled, not listed
    train = env.tasks("train", 500, seed=1)
    heldout = env.tasks("heldout", 500, seed=1)
    assert not {t.task_id for t in train} & {t.task_id for t in heldout}
    assert len({t.task_id for t in train}) == 500
    assert [t.task_id for t in train] == [t.task_id for t in env.tasks("train", 500, seed=1)]
    assert [t.task_id for t in train] != [t.task_id for t in env.tasks("train", 500, seed=2)]
    assert all(dict(t.metadata)["split"] == "heldout" for t in heldout)


def test_listed_splits_partition_a_small_space():
    env = ArithmeticChatEnv(min_operand=10, max_operand=29)  # 20 * 20 = 400 problems, listed
    train = {t.task_id for t in env.tasks("train", 1000, seed=0)}
    heldout = {t.task_id for t in env.tasks("heldout", 1000, seed=0)}
    assert not train & heldout
    assert len(train) + len(heldout) == 400  # 1000 draws per split cover each split whole


def test_a_problem_stays_in_its_split_whatever_the_operand_range():
    small = ArithmeticChatEnv(min_operand=10, max_operand=99)  # listed
    large = ArithmeticChatEnv(min_operand=10, max_operand=999)  # sampled
    held_small = {t.task_id for t in small.tasks("heldout", 500, seed=0)}
    train_large = {t.task_id for t in large.tasks("train", 5000, seed=0)}
    assert not held_small & train_large


def test_bad_parameters_raise():
    with pytest.raises(ValueError, match="min_operand"):
        ArithmeticChatEnv(min_operand=50, max_operand=20)
    with pytest.raises(ValueError, match="operations"):
        ArithmeticChatEnv(operations="/")
    with pytest.raises(ValueError, match="answer_format"):
        ArithmeticChatEnv(answer_format="words")
    with pytest.raises(ValueError, match="too many"):
        ArithmeticChatEnv(min_operand=0, max_operand=300).tasks("train", 30_000, seed=0)  # > 301*301/4


def test_registered_and_built_from_the_envs_section():
    env = build_env("arithmetic_chat", max_operand=99, max_word_len=6, timeout_s=5.0)
    assert isinstance(env, ArithmeticChatEnv) and env.max_operand == 99
    mixture = Mixture({"arithmetic_chat": env}, {"arithmetic_chat": 1.0})
    tasks = mixture.sample(8, rng_seed=0)
    assert all(mixture.env_for(t) is env for t in tasks)
