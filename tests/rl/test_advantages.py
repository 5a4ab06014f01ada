"""Group advantages, with the arithmetic of every expected number in a comment."""

import math

import pytest

from rlpipe.rl.advantages import group_advantages


def approx(values, tol=1e-5):
    return [None if v is None else pytest.approx(v, abs=tol) for v in values]


def test_grpo_one_right_of_four():
    # mean = 1/4 = 0.25; sample var = (0.75^2 + 3 * 0.25^2) / (4 - 1) = (0.5625 + 0.1875) / 3 = 0.25
    # std = 0.5; 0.75 / (0.5 + 1e-6) = 1.499997; -0.25 / (0.5 + 1e-6) = -0.499999
    assert group_advantages([1.0, 0.0, 0.0, 0.0], "grpo") == approx([1.499997, -0.499999, -0.499999, -0.499999], tol=1e-6)


def test_grpo_half_right_uses_sample_std():
    # mean = 0.5; sample std = sqrt((4 * 0.25) / (4 - 1)) = sqrt(1/3) = 0.5773503 (population std would be 0.5)
    # (1 - 0.5) / (0.5773503 + 1e-6) = 0.8660239
    assert group_advantages([1.0, 0.0, 0.0, 1.0], "grpo") == approx([0.8660239, -0.8660239, -0.8660239, 0.8660239], tol=1e-7)


def test_drgrpo_is_reward_minus_mean():
    # mean = 0.25: 1 - 0.25 = 0.75, 0 - 0.25 = -0.25
    assert group_advantages([1.0, 0.0, 0.0, 0.0], "drgrpo") == approx([0.75, -0.25, -0.25, -0.25])


def test_rloo_is_reward_minus_mean_of_others():
    # 1 - mean(0, 0, 0) = 1; 0 - mean(1, 0, 0) = -1/3
    assert group_advantages([1.0, 0.0, 0.0, 0.0], "rloo") == approx([1.0, -1 / 3, -1 / 3, -1 / 3])


@pytest.mark.parametrize("method", ["grpo", "drgrpo", "rloo"])
def test_none_rewards_are_excluded_and_stay_none(method):
    # scored rewards [1, 0]: mean 0.5, sample std sqrt((0.25 + 0.25) / 1) = 0.7071068
    # -> grpo +-0.5 / (0.7071068 + 1e-6) = +-0.7071058; drgrpo +-0.5; rloo 1-0=1, 0-1=-1
    expected = {"grpo": 0.7071058, "drgrpo": 0.5, "rloo": 1.0}[method]
    assert group_advantages([1.0, None, 0.0], method) == approx([expected, None, -expected], tol=1e-6)


@pytest.mark.parametrize("method", ["grpo", "drgrpo", "rloo"])
def test_group_of_one_gets_zero(method):
    assert group_advantages([1.0], method) == [0.0]
    assert group_advantages([None, 0.7, None], method) == [None, 0.0, None]


@pytest.mark.parametrize("method", ["grpo", "drgrpo", "rloo"])
def test_all_equal_rewards_get_zero_not_nan(method):
    assert group_advantages([1.0, 1.0, 1.0], method) == [0.0, 0.0, 0.0]
    assert group_advantages([0.0, None, 0.0], method) == [0.0, None, 0.0]


def test_all_none_and_empty():
    assert group_advantages([None, None]) == [None, None]
    assert group_advantages([]) == []


def test_grpo_advantages_have_zero_mean_and_unit_sample_std():
    advantages = group_advantages([0.2, 0.9, 0.4, 0.0, 1.0], "grpo", eps=0.0)
    mean = sum(advantages) / 5
    assert mean == pytest.approx(0.0, abs=1e-9)
    assert math.sqrt(sum((a - mean) ** 2 for a in advantages) / (5 - 1)) == pytest.approx(1.0)


def test_unknown_method_raises():
    with pytest.raises(ValueError, match="unknown advantage method"):
        group_advantages([1.0, 0.0], "ppo")
