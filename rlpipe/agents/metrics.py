"""The metrics of an eval, from the final attempt of each task (what `rlpipe eval --json` prints).

    success_rate          passed / scored; scored = trials with an agent verdict (infrastructure
                          failures and tasks not run are left out and counted apart); 0.0 when
                          nothing was scored
    trials, scored, passed, infrastructure_failures, not_run
    attempts, infrastructure_retries   attempts made in all; attempts beyond one per task
    verdicts              {verdict: count} of the final attempts
    failure_modes         {"agent": {verdict: n}, "infrastructure": {verdict: n}} (failures only)
    steps_mean, steps_p50, steps_p90              agent replies per scored trial
    duration_s_mean, duration_s_p50, duration_s_p90   wall-clock seconds per scored trial
    replies               agent replies in scored trials (each one is a tool-call attempt)
    well_formed_rate      replies holding a JSON object with a tool name / replies
    known_tool_rate       of those, naming one of the tools
    valid_arguments_rate  of those, with the arguments the tool's schema requires
    tool_calls, malformed_calls   valid calls; replies that were not
    bash_calls, bash_exit_zero_rate   bash calls, and the share that exited 0
    tool_errors           valid calls whose tool failed (bash exit != 0, missing file, ...)
    well_formed / known / valid rates are 1.0 when there is nothing to rate.

Percentiles interpolate linearly between order statistics (numpy's default): p of n sorted
values is at position p/100 * (n - 1).

What it does not do: read the lake or run trials.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from rlpipe.agents.records import TrialResult, TrialVerdict

NOT_WELL_FORMED = frozenset({"no_call", "invalid_json", "not_an_object"})


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) with linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = p / 100 * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _rate(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else 1.0


def _spread(name: str, values: Sequence[float]) -> dict[str, float]:
    mean = sum(values) / len(values) if values else 0.0
    return {f"{name}_mean": mean, f"{name}_p50": percentile(values, 50), f"{name}_p90": percentile(values, 90)}


def eval_metrics(trials: Sequence[TrialResult], attempts: int | None = None) -> dict[str, object]:
    """Metrics of the final trials; `attempts` is how many were made in all (default: one each)."""
    attempts = len(trials) if attempts is None else attempts
    scored = [trial for trial in trials if trial.verdict.family == "agent"]
    passed = sum(trial.passed for trial in scored)
    replies = [step for trial in scored for step in trial.steps]
    kinds = Counter(step.malformed_kind for step in replies if step.malformed_kind is not None)
    well_formed = len(replies) - sum(kinds[kind] for kind in NOT_WELL_FORMED)
    known = well_formed - kinds["unknown_tool"]
    valid = known - kinds["bad_arguments"]
    bash = [step for step in replies if step.tool == "bash"]
    counts = Counter(trial.verdict.value for trial in trials)
    failures: dict[str, dict[str, int]] = {"agent": {}, "infrastructure": {}}
    for verdict in TrialVerdict:
        if counts[verdict.value] and verdict is not TrialVerdict.PASSED and verdict.family in failures:
            failures[verdict.family][verdict.value] = counts[verdict.value]
    return {
        "success_rate": passed / len(scored) if scored else 0.0,
        "trials": len(trials),
        "scored": len(scored),
        "passed": passed,
        "infrastructure_failures": sum(trial.verdict.family == "infrastructure" for trial in trials),
        "not_run": sum(trial.verdict.family == "not_run" for trial in trials),
        "attempts": attempts,
        "infrastructure_retries": attempts - len(trials),
        "verdicts": {verdict.value: counts[verdict.value] for verdict in TrialVerdict if counts[verdict.value]},
        "failure_modes": failures,
        **_spread("steps", [float(len(trial.steps)) for trial in scored]),
        **_spread("duration_s", [trial.duration_s for trial in scored]),
        "replies": len(replies),
        "well_formed_rate": _rate(well_formed, len(replies)),
        "known_tool_rate": _rate(known, well_formed),
        "valid_arguments_rate": _rate(valid, known),
        "tool_calls": valid,
        "malformed_calls": len(replies) - valid,
        "bash_calls": len(bash),
        "bash_exit_zero_rate": _rate(sum(step.exit_code == 0 for step in bash), len(bash)),
        "tool_errors": sum(step.tool_error for step in replies),
    }
