"""Regressions of per-domain held-out accuracy: a domain whose accuracy now is below its best
over the last few evaluations by more than a threshold, or by more than `z` standard errors
of the difference of two binomial proportions over `tasks` held-out tasks each (so that a
domain near 0.1 that falls to 0.02 is seen: 200 tasks, z = 3.2, where an absolute 0.1 cannot
fire, while a swing of 0.08 at 0.2 is noise: z = 2.1). Pure: numbers in, findings out.

What it does not: read evaluations or raise alerts (tasks/lifecycle.py reads the stored
evaluations, orchestration/track.py `alert_regressions` writes the artifact, tag and warning); it
never stops a run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ACCURACY_PREFIX = "accuracy/"


@dataclass(frozen=True)
class Evaluation:
    """One held-out evaluation: its name (before_rl, step_000010, ...), the policy version
    it measured, and the greedy accuracy per domain."""

    name: str
    policy_version: int
    accuracy: Mapping[str, float]

    @staticmethod
    def from_result(name: str, policy_version: int, result: Mapping[str, float]) -> Evaluation:
        """From evaluate's result (`accuracy`, `accuracy/<domain>`): the per-domain part."""
        return Evaluation(name, policy_version, {key[len(ACCURACY_PREFIX):]: float(value) for key, value in result.items()
                                                 if key.startswith(ACCURACY_PREFIX)})


@dataclass(frozen=True)
class Regression:
    domain: str
    best: float
    best_at: Evaluation
    now: float
    at: Evaluation

    @property
    def drop(self) -> float:
        return self.best - self.now

    def line(self) -> str:
        return (f"held-out accuracy of {self.domain} fell {self.drop:.3f}: {self.best:.3f} at {self.best_at.name} "
                f"(policy version {self.best_at.policy_version}) -> {self.now:.3f} at {self.at.name} "
                f"(policy version {self.at.policy_version})")


def find_regressions(earlier: Sequence[Evaluation], current: Evaluation, threshold: float, window: int,
                     z: float | None = None, tasks: int = 0) -> list[Regression]:
    """Domains of `current` whose accuracy is more than `threshold` below their best over the
    last `window` of `earlier` (ordered oldest first) that measured them, or (with `z` and
    `tasks`) below it by more than `z` standard errors (`fall_in_standard_errors`)."""
    recent = list(earlier)[-window:] if window > 0 else []
    found = []
    for domain, now in sorted(current.accuracy.items()):
        measured = [evaluation for evaluation in recent if domain in evaluation.accuracy]
        if not measured:
            continue
        best_at = max(measured, key=lambda evaluation: evaluation.accuracy[domain])  # the earliest of equal bests
        best = best_at.accuracy[domain]
        significant = z is not None and tasks > 0 and fall_in_standard_errors(best, now, tasks) > z
        if best - now > threshold or significant:
            found.append(Regression(domain, best, best_at, now, current))
    return found


def fall_in_standard_errors(best: float, now: float, tasks: int) -> float:
    """(best - now) over the standard error of the difference of two accuracies measured on
    `tasks` tasks each (pooled: sqrt(2 p (1 - p) / tasks)); 0 when there is no fall, and
    when both are 0 or both 1 (no variance: no evidence either way)."""
    pooled = (best + now) / 2
    if best <= now or pooled <= 0 or pooled >= 1:
        return 0.0
    return (best - now) / math.sqrt(2 * pooled * (1 - pooled) / tasks)
