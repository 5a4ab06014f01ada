"""Eval metrics from hand-made trials: percentiles, tool-call accuracy, and failure modes kept apart."""

from __future__ import annotations

from rlpipe.agents.metrics import eval_metrics, percentile
from rlpipe.agents.records import Ending, TrialResult, TrialStep, TrialVerdict


def step(index: int, tool: str | None, malformed: str | None = None, exit_code: int | None = None) -> TrialStep:
    return TrialStep(index, "reply", tool, {}, malformed, "", exit_code, exit_code not in (None, 0), 0.1)


def trial(task_id: str, verdict: TrialVerdict, steps: tuple[TrialStep, ...] = (), duration_s: float = 1.0) -> TrialResult:
    return TrialResult(task_id, "a", "bwrap", verdict, Ending.SUBMITTED, None, "", steps=steps, duration_s=duration_s)


def test_percentiles_interpolate_between_order_statistics():
    # 10 20 30 40: p50 at position 0.5 * 3 = 1.5 -> 20 + 0.5 * 10 = 25; p90 at 2.7 -> 30 + 0.7 * 10 = 37
    assert percentile([40, 10, 30, 20], 50) == 25.0
    assert abs(percentile([40, 10, 30, 20], 90) - 37.0) < 1e-9
    assert percentile([], 50) == 0.0 and percentile([7.0], 90) == 7.0


def test_tool_call_accuracy_and_failure_modes():
    solved = trial("t1", TrialVerdict.PASSED, (step(0, "bash", exit_code=0), step(1, "bash", exit_code=2), step(2, "submit")),
                   duration_s=2.0)
    sloppy = trial("t2", TrialVerdict.MALFORMED_CALLS, (step(0, None, "invalid_json"), step(1, None, "unknown_tool"),
                                                         step(2, None, "bad_arguments"), step(3, "read_file")), duration_s=4.0)
    died = trial("t3", TrialVerdict.SANDBOX_ERROR, (step(0, "bash", exit_code=0),), duration_s=9.0)
    skipped = trial("t4", TrialVerdict.SKIPPED)
    metrics = eval_metrics([solved, sloppy, died, skipped], attempts=6)
    # scored: t1 and t2 (t3 is infrastructure, t4 not run); 1 of 2 passed
    assert (metrics["success_rate"], metrics["scored"], metrics["infrastructure_failures"], metrics["not_run"]) == (0.5, 2, 1, 1)
    assert (metrics["attempts"], metrics["infrastructure_retries"]) == (6, 2)  # 6 attempts for 4 tasks
    assert metrics["failure_modes"] == {"agent": {"malformed_calls": 1}, "infrastructure": {"sandbox_error": 1}}
    # 7 replies in scored trials; invalid_json is not well formed: 6/7; unknown_tool: known 5/6; bad_arguments: valid 4/5
    assert metrics["replies"] == 7
    assert (metrics["well_formed_rate"], metrics["known_tool_rate"], metrics["valid_arguments_rate"]) == (6 / 7, 5 / 6, 4 / 5)
    assert (metrics["tool_calls"], metrics["malformed_calls"]) == (4, 3)
    # bash calls in scored trials: exit 0 and exit 2 -> 1/2 (t3's call is not scored)
    assert (metrics["bash_calls"], metrics["bash_exit_zero_rate"], metrics["tool_errors"]) == (2, 0.5, 1)
    # steps of scored trials 3 and 4: mean 3.5, p50 3.5, p90 3 + 0.9 = 3.9; durations 2 and 4: p90 2 + 0.9 * 2 = 3.8
    assert (metrics["steps_mean"], metrics["steps_p50"]) == (3.5, 3.5) and abs(metrics["steps_p90"] - 3.9) < 1e-9
    assert (metrics["duration_s_mean"], metrics["duration_s_p50"]) == (3.0, 3.0) and abs(metrics["duration_s_p90"] - 3.8) < 1e-9


def test_nothing_scored_gives_zero_success_and_neutral_rates():
    metrics = eval_metrics([trial("t", TrialVerdict.SETUP_ERROR)])
    assert (metrics["success_rate"], metrics["scored"], metrics["well_formed_rate"], metrics["steps_p90"]) == (0.0, 0, 1.0, 0.0)
