"""The arithmetic of a race between two accuracy-over-time curves (benchmarks/race_smollm2.py):
a curve is the held-out accuracy measured at some training seconds, and between two
measurements a side is taken to hold the value last measured (a step function: what a user
who stopped there would have). Two comparisons, the goal of issue 33 item 2:

- `time_to_reach`: the first measured time at which one curve reaches a target accuracy
  (e.g. the other side's final accuracy), None if it never does;
- `largest_deficit`: over every time both curves are measured to (the union of their
  points up to the shorter one's end), the largest amount by which one curve is behind the
  other, with the binomial standard error of that difference (each accuracy on n problems).

What it does not: measure, run anything, or decide what "beyond noise" is (the caller
prints the deficit in standard errors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    """One held-out evaluation: `seconds` of training (evaluations excluded) and the
    accuracy measured there on `count` problems."""

    seconds: float
    accuracy: float
    count: int


@dataclass(frozen=True)
class Deficit:
    """`behind` = leader's accuracy - trailer's at `seconds` (<= 0: never behind), with the
    binomial standard error of that difference."""

    seconds: float
    behind: float
    standard_error: float

    @property
    def in_errors(self) -> float:
        """The deficit in standard errors (inf when the error is 0 and the deficit positive)."""
        if self.standard_error > 0:
            return self.behind / self.standard_error
        return math.inf if self.behind > 0 else 0.0


def _checked(curve: list[Point]) -> list[Point]:
    if not curve:
        raise ValueError("a curve needs at least one point (the accuracy before training, at 0 s)")
    ordered = sorted(curve, key=lambda p: p.seconds)
    if any(not 0.0 <= p.accuracy <= 1.0 or p.count < 1 or p.seconds < 0 for p in ordered):
        raise ValueError(f"points need 0 <= accuracy <= 1, count >= 1 and seconds >= 0: {ordered}")
    return ordered


def value_at(curve: list[Point], seconds: float) -> Point | None:
    """The last point measured at or before `seconds` (None before the first)."""
    last = None
    for point in _checked(curve):
        if point.seconds > seconds:
            break
        last = point
    return last


def time_to_reach(curve: list[Point], target: float) -> float | None:
    """The first measured time whose accuracy is >= `target`; None if no point reaches it."""
    return next((p.seconds for p in _checked(curve) if p.accuracy >= target), None)


def binomial_difference_error(a: Point, b: Point) -> float:
    """sqrt(p1 (1 - p1) / n1 + p2 (1 - p2) / n2): the standard error of a - b."""
    return math.sqrt(a.accuracy * (1 - a.accuracy) / a.count + b.accuracy * (1 - b.accuracy) / b.count)


def largest_deficit(trailer: list[Point], leader: list[Point]) -> Deficit:
    """How far `trailer` is behind `leader` at its worst, over the times both are measured
    to: every point of either curve up to the earlier of their last points, each side at its
    value then (`value_at`). Ties of the largest deficit go to the earliest time."""
    trailer, leader = _checked(trailer), _checked(leader)
    end = min(trailer[-1].seconds, leader[-1].seconds)
    start = max(trailer[0].seconds, leader[0].seconds)
    times = sorted({p.seconds for p in trailer + leader if start <= p.seconds <= end})
    if not times:
        raise ValueError(f"the curves do not overlap in time (one starts at {start:g} s, the other ends at {end:g} s)")
    worst: Deficit | None = None
    for moment in times:
        mine, theirs = value_at(trailer, moment), value_at(leader, moment)
        assert mine is not None and theirs is not None  # moment >= both first points
        deficit = Deficit(moment, theirs.accuracy - mine.accuracy, binomial_difference_error(mine, theirs))
        if worst is None or deficit.behind > worst.behind:
            worst = deficit
    assert worst is not None
    return worst
