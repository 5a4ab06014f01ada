"""The race's comparisons on hand-made curves (benchmarks/race_curves.py): the time one
curve takes to reach a target, and the largest deficit at equal time with its standard
error, each side holding its last measured value between evaluations."""

from __future__ import annotations

import math

import pytest

from benchmarks.race_curves import Point, binomial_difference_error, largest_deficit, time_to_reach, value_at


def curve(*pairs: tuple[float, float], count: int = 200) -> list[Point]:
    return [Point(seconds, accuracy, count) for seconds, accuracy in pairs]


def test_value_at_holds_the_last_measurement() -> None:
    points = curve((0, 0.1), (100, 0.3), (200, 0.5))
    assert value_at(points, 150).accuracy == 0.3
    assert value_at(points, 200).accuracy == 0.5
    assert value_at(curve((10, 0.2)), 5) is None


def test_time_to_reach_is_the_first_point_at_or_above_the_target() -> None:
    points = curve((0, 0.1), (60, 0.25), (120, 0.4), (180, 0.35))
    assert time_to_reach(points, 0.25) == 60
    assert time_to_reach(points, 0.3) == 120
    assert time_to_reach(points, 0.41) is None


def test_largest_deficit_compares_at_every_point_of_either_curve() -> None:
    fast = curve((0, 0.1), (50, 0.3), (100, 0.32), (150, 0.33))
    slow = curve((0, 0.1), (120, 0.4), (240, 0.5))
    # at 120 s the slow side's 0.40 is measured while the fast one holds 0.32 (its 100 s point);
    # 240 s is past the fast curve's end, so it is not compared
    deficit = largest_deficit(fast, slow)
    assert deficit.seconds == 120
    assert deficit.behind == pytest.approx(0.08)
    expected = math.sqrt(0.32 * 0.68 / 200 + 0.4 * 0.6 / 200)
    assert deficit.standard_error == pytest.approx(expected)
    assert deficit.in_errors == pytest.approx(0.08 / expected)


def test_a_side_always_ahead_has_no_positive_deficit() -> None:
    ahead = curve((0, 0.1), (60, 0.3), (120, 0.4))
    behind = curve((0, 0.1), (90, 0.2), (120, 0.25))
    deficit = largest_deficit(ahead, behind)
    assert deficit.behind <= 0
    assert deficit.in_errors <= 0
    assert largest_deficit(behind, ahead).behind == pytest.approx(0.2)


def test_the_error_of_a_difference_uses_each_side_s_count() -> None:
    a, b = Point(0, 0.5, 100), Point(0, 0.2, 400)
    assert binomial_difference_error(a, b) == pytest.approx(math.sqrt(0.25 / 100 + 0.16 / 400))


@pytest.mark.parametrize("bad", [[], [Point(0, 1.5, 10)], [Point(0, 0.5, 0)], [Point(-1, 0.5, 10)]])
def test_bad_curves_are_refused(bad: list[Point]) -> None:
    with pytest.raises(ValueError):
        time_to_reach(bad, 0.5)


def test_curves_that_do_not_overlap_are_refused() -> None:
    with pytest.raises(ValueError, match="do not overlap"):
        largest_deficit(curve((0, 0.1), (10, 0.2)), curve((20, 0.1), (30, 0.2)))
