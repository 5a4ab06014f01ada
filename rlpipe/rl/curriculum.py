"""The domain curriculum: the sampling ratios of RL step s from the pass rates of the run's
committed steps. Pure: numbers in, ratios out; no I/O, no clock, no global state.

The rule (all of it):

- Each domain's pass rate after step L is the mean, over the committed steps
  L - window + 1 .. L (steps >= 1) whose rows hold the domain, of that step's mean reward
  of the domain (`reward/<domain>` of the step's manifest: its pass rate for 0/1 rewards).
  A domain with no such step has no pass rate yet.
- Its learnability is 1 inside the band [low, high]; below it falls linearly to 0 at pass
  rate 0 (hopeless), above it to 0 at pass rate 1 (solved). No pass rate yet counts as 1.
- The target is the configured (base) ratio times the learnability, normalised; if every
  learnability is 0 the target is the base ratios.
- The state q moves `rate` of the way toward the target once per step:
  q_0 = base, q_s = (1 - rate) q_{s-1} + rate target(pass rates after step s - 1 - delay).
  `delay` is rollout.max_staleness: step s is drawn while steps s-1 .. s-delay may still
  be running, so only steps <= s - 1 - delay are known (to a live run and to a resumed one
  alike). A target from L < 1 (no step committed) is the base: q stays q_0.
- The ratios drawn with are q with a floor: (1 - n min_ratio) q + min_ratio for each of
  the n domains of base ratio > 0, so none starves and they still sum to 1. Domains of base
  ratio 0 stay at 0.

So the ratios of step s are a function of the config and the committed steps' metrics
alone: a run resumed after a kill recomputes exactly the ratios the killed run drew with.
`Curriculum` memoises q per step (committed steps never change) so a run reads each step's
metrics once.

What it does not: read the lake (the caller passes `rates_of_step`), draw tasks
(envs/mixture.py), or look at held-out accuracy (rl/heldout_regression.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from statistics import fmean

REWARD_PREFIX = "reward/"


@dataclass(frozen=True)
class CurriculumSettings:
    """The [curriculum] table (see rlpipe/core/config_sections.py for each field) plus the delay."""

    low: float = 0.2
    high: float = 0.8
    rate: float = 0.2
    min_ratio: float = 0.05
    window: int = 4
    delay: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.low < self.high <= 1.0:
            raise ValueError(f"the learnable band must satisfy 0 <= low < high <= 1, got [{self.low}, {self.high}]")
        if not 0.0 < self.rate <= 1.0:
            raise ValueError(f"rate must be in (0, 1], got {self.rate}")
        if self.min_ratio < 0 or self.window < 1 or self.delay < 0:
            raise ValueError(f"need min_ratio >= 0, window >= 1, delay >= 0; got {self.min_ratio}, {self.window}, {self.delay}")


def domain_rates(metrics: Mapping[str, float]) -> dict[str, float]:
    """`reward/<domain>` of one step's manifest metrics, by domain (not `reward/mean`)."""
    return {key[len(REWARD_PREFIX):]: value for key, value in metrics.items()
            if key.startswith(REWARD_PREFIX) and key != "reward/mean"}


def learnability(pass_rate: float | None, low: float, high: float) -> float:
    """1 inside [low, high]; linear down to 0 at pass rate 0 and at 1; 1 when unknown."""
    if pass_rate is None or low <= pass_rate <= high:
        return 1.0
    if pass_rate < low:
        return max(0.0, pass_rate / low)
    return max(0.0, (1.0 - pass_rate) / (1.0 - high))


def normalised(ratios: Mapping[str, float]) -> dict[str, float]:
    total = sum(ratios.values())
    if total <= 0:
        raise ValueError(f"ratios must sum to > 0, got {dict(ratios)}")
    return {name: value / total for name, value in ratios.items()}


def target_ratios(base: Mapping[str, float], pass_rates: Mapping[str, float | None], low: float, high: float) -> dict[str, float]:
    """base x learnability, normalised; the base itself when no domain is learnable."""
    weighted = {name: ratio * learnability(pass_rates.get(name), low, high) for name, ratio in base.items()}
    return normalised(weighted) if sum(weighted.values()) > 0 else normalised(base)


def next_state(state: Mapping[str, float], target: Mapping[str, float], rate: float) -> dict[str, float]:
    """`rate` of the way from `state` toward `target`."""
    return {name: (1.0 - rate) * value + rate * target[name] for name, value in state.items()}


def with_floor(state: Mapping[str, float], min_ratio: float) -> dict[str, float]:
    """(1 - n min_ratio) q + min_ratio for the n domains with q > 0 or a base ratio > 0 (the
    caller passes only those); sums to 1 when q does."""
    count = len(state)
    if count * min_ratio > 1.0:
        raise ValueError(f"min_ratio {min_ratio} x {count} domains exceeds 1: no ratios can meet the floor")
    return {name: (1.0 - count * min_ratio) * value + min_ratio for name, value in state.items()}


def window_pass_rates(rates_by_step: Mapping[int, Mapping[str, float]], last: int, window: int) -> dict[str, float]:
    """Mean per domain of the steps max(1, last - window + 1) .. last that hold the domain."""
    seen: dict[str, list[float]] = {}
    for step in range(max(1, last - window + 1), last + 1):
        for name, value in rates_by_step[step].items():
            seen.setdefault(name, []).append(value)
    return {name: fmean(values) for name, values in seen.items()}


class Curriculum:
    """q per step for one run, memoised. `rates_of_step(k)` returns committed step k's
    per-domain mean rewards (`domain_rates` of its manifest metrics), or None when step k
    is not committed: then asking for a step that needs it raises MissingStep."""

    def __init__(self, base: Mapping[str, float], settings: CurriculumSettings,
                 rates_of_step: Callable[[int], Mapping[str, float] | None]) -> None:
        active = {name: ratio for name, ratio in base.items() if ratio > 0}
        self.base = normalised(active)
        self.inactive = sorted(name for name, ratio in base.items() if ratio <= 0)
        self.settings = settings
        with_floor(self.base, settings.min_ratio)  # fails now, not at step 1, when the floor cannot hold
        self._rates_of_step = rates_of_step
        self._rates: dict[int, dict[str, float]] = {}
        self._states: dict[int, dict[str, float]] = {0: dict(self.base)}

    def ratios(self, step: int) -> dict[str, float]:
        """The sampling ratios of RL step `step` (>= 1), every base domain named (inactive ones 0)."""
        if step < 1:
            raise ValueError(f"RL steps start at 1, got {step}")
        ratios = with_floor(self._state(step), self.settings.min_ratio)
        return {**ratios, **{name: 0.0 for name in self.inactive}}

    def _state(self, step: int) -> dict[str, float]:
        known = max(s for s in self._states if s <= step)
        for current in range(known + 1, step + 1):  # iteratively: no recursion depth limit on long runs
            last = current - 1 - self.settings.delay
            target = self.base if last < 1 else target_ratios(
                self.base, window_pass_rates(self._rates_window(last), last, self.settings.window),
                self.settings.low, self.settings.high)
            self._states[current] = next_state(self._states[current - 1], target, self.settings.rate)
        return self._states[step]

    def _rates_window(self, last: int) -> dict[int, dict[str, float]]:
        for step in range(max(1, last - self.settings.window + 1), last + 1):
            if step not in self._rates:
                rates = self._rates_of_step(step)
                if rates is None:
                    raise MissingStep(step)
                self._rates[step] = {name: value for name, value in rates.items() if name in self.base}
        return self._rates


class MissingStep(Exception):
    """The curriculum needs a step that is not committed (a caller that draws too far ahead)."""

    def __init__(self, step: int) -> None:
        super().__init__(f"the curriculum needs committed step {step}, which is not committed")
        self.step = step
