"""Exact-answer verifiers (arithmetic, reverse), their splits, and the mixture."""

import pytest

from rlpipe.core.errors import ConfigError
from rlpipe.core.records import VerdictReason
from rlpipe.envs.arithmetic import ArithmeticEnv
from rlpipe.envs.exact import DETAIL_CHARS, verify_exact
from rlpipe.envs.mixture import Mixture, build_env
from rlpipe.envs.reverse import ReverseEnv

OK, WRONG, FORMAT = VerdictReason.OK, VerdictReason.WRONG, VerdictReason.FORMAT

CASES = [
    # (model output, expected reason) for the expected answer "95"
    ("95", OK),
    (" 95\n", OK),  # surrounding whitespace is not part of the answer
    ("\t95  ", OK),
    ("96", WRONG),
    ("095", WRONG),  # no number parsing
    ("95.0", WRONG),
    ("-95", WRONG),
    ("9 5", FORMAT),  # two fields
    ("95 95", FORMAT),  # several answers, even if all right
    ("95\n96", FORMAT),
    ("the answer is 95", FORMAT),  # extra text
    ("95 because 37+58", FORMAT),
    ("", FORMAT),
    ("   \n\t", FORMAT),
    ("９５", WRONG),  # fullwidth digits are not normalised
    ("95\u200b", WRONG),  # zero-width space is not whitespace for str.strip
    ("\u00a095\u00a0", OK),  # no-break spaces are whitespace for str.strip
    ("é" * 50, WRONG),
    ("\ud800", WRONG),  # lone surrogate
    ("95" * 600, FORMAT),  # 1200 chars: too long
    ("9" * 1_000_000, FORMAT),  # 1 MB of digits
    ("95\n" + "x" * 1_000_000, FORMAT),  # right answer followed by 1 MB of noise
    ("PASSED", WRONG),
]


@pytest.mark.parametrize("output, reason", CASES, ids=[repr(case[0][:20]) for case in CASES])
def test_verify_exact_table(output, reason):
    verdict = verify_exact(output, "95", verifier_version="v1")
    assert verdict.reason is reason
    assert verdict.passed is (reason is OK)
    assert verdict.reward == (1.0 if reason is OK else 0.0)
    assert len(verdict.detail) <= DETAIL_CHARS
    assert verdict.verifier_version == "v1"


def test_verify_exact_never_raises_on_non_strings():
    assert verify_exact(None, "95", "v").reason is WRONG  # type: ignore[arg-type]
    assert verify_exact(95, "95", "v").passed  # type: ignore[arg-type]


def test_arithmetic_oracle_passes_and_prompt_shape():
    env = ArithmeticEnv(max_operand=99)
    for task in env.tasks("train", 50, seed=3):
        a, b = task.prompt[:-1].split("+")
        assert task.reference_answer == str(int(a) + int(b))
        assert env.verify(task, task.reference_answer).passed
        assert not env.verify(task, "").passed


@pytest.mark.parametrize("max_operand", [9, 19, 99])
def test_arithmetic_splits_are_disjoint_and_cover_everything(max_operand):
    env = ArithmeticEnv(max_operand=max_operand)
    train = {task.task_id for task in env.tasks("train", env.split_size("train"), seed=0)}
    heldout = {task.task_id for task in env.tasks("heldout", env.split_size("heldout"), seed=1)}
    assert not train & heldout
    assert len(train) + len(heldout) == (max_operand + 1) ** 2


def test_splits_disjoint_across_seeds_and_deterministic():
    for env in (ArithmeticEnv(max_operand=49), ReverseEnv(max_word_len=5)):
        train = {task.task_id for seed in range(5) for task in env.tasks("train", 200, seed)}
        heldout = {task.task_id for seed in range(5) for task in env.tasks("heldout", 200, seed)}
        assert not train & heldout
        assert env.tasks("train", 30, seed=7) == env.tasks("train", 30, seed=7)
        assert env.tasks("train", 30, seed=7) != env.tasks("train", 30, seed=8)
        assert len({task.task_id for task in env.tasks("heldout", 200, seed=0)}) == 200


def test_reverse_oracle_and_prompt():
    env = ReverseEnv(max_word_len=6)
    for task in env.tasks("heldout", 40, seed=0):
        word = task.prompt.removeprefix("reverse ").removesuffix("=")
        assert 3 <= len(word) <= 6 and task.reference_answer == word[::-1]
        assert env.verify(task, task.reference_answer + "\n").passed
        assert not env.verify(task, word + " " + word[::-1]).passed


def test_verifier_version_depends_on_params():
    assert ArithmeticEnv(9).verifier_version == ArithmeticEnv(9).verifier_version
    assert ArithmeticEnv(9).verifier_version != ArithmeticEnv(10).verifier_version
    assert ReverseEnv(5).verifier_version != ReverseEnv(6).verifier_version


def test_mixture_samples_by_ratio_from_train_splits():
    mixture = Mixture({"arithmetic": ArithmeticEnv(19), "reverse": ReverseEnv(4)}, {"arithmetic": 3.0, "reverse": 1.0})
    tasks = mixture.sample(400, rng_seed=0)
    share = sum(task.domain == "arithmetic" for task in tasks) / len(tasks)
    assert 0.68 < share < 0.82  # 0.75 +- ~3.5 standard deviations of a binomial(400, 0.75)
    assert all(dict(task.metadata)["split"] == "train" for task in tasks)
    assert tasks == mixture.sample(400, rng_seed=0)
    assert all(mixture.env_for(task).name == task.domain for task in tasks)
    assert {task.domain for task in mixture.heldout(5)} == {"arithmetic", "reverse"}


def test_mixture_zero_ratio_domain_is_never_sampled():
    mixture = Mixture({"arithmetic": ArithmeticEnv(9), "reverse": ReverseEnv(4)}, {"arithmetic": 1.0})
    assert {task.domain for task in mixture.sample(50, rng_seed=1)} == {"arithmetic"}


def test_build_env_registry_and_errors():
    env = build_env("arithmetic", max_operand=12, max_word_len=4, train_size=10)  # extra flat params ignored
    assert isinstance(env, ArithmeticEnv) and env.max_operand == 12
    assert isinstance(build_env("reverse", max_word_len=4), ReverseEnv)
    with pytest.raises(ConfigError, match="unknown domain 'algebra'"):
        build_env("algebra")
    with pytest.raises(ConfigError, match="bad parameters"):
        build_env("arithmetic", max_operand=0)
    with pytest.raises(ConfigError):
        Mixture({"arithmetic": ArithmeticEnv(9)}, {"reverse": 1.0})
