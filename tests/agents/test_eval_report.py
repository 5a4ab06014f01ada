"""The eval's report: flat metrics, the markdown page and the plots from hand-made trials, and
the MLflow run they land in (a sqlite store under tmp_path), found again by a resumed session."""

from __future__ import annotations

from pathlib import Path

from mlflow import MlflowClient

from rlpipe.agents.evaluation import EvalReport
from rlpipe.agents.metrics import eval_metrics
from rlpipe.agents.records import Ending, TrialResult, TrialStep, TrialVerdict
from rlpipe.agents.report import flat_metrics, report_markdown, report_plots
from rlpipe.controller.eval_tracking import REPORT_FILE, build_eval_tracker, track_eval
from rlpipe.storage.eval_records import EvalInfo

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
KINDS = {"t1": "git", "t2": "git", "t3": "data-wrangling"}


def trial(task_id: str, verdict: TrialVerdict, steps: int, duration_s: float = 1.0) -> TrialResult:
    replies = tuple(TrialStep(i, "r", "bash", {}, None, "", 0, False, 0.1) for i in range(steps))
    return TrialResult(task_id, "a", "bwrap", verdict, Ending.SUBMITTED, None, "why | not", steps=replies, duration_s=duration_s)


TRIALS = (trial("t1", TrialVerdict.PASSED, 2), trial("t2", TrialVerdict.FAILED, 4), trial("t3", TrialVerdict.SANDBOX_ERROR, 1))


def test_flat_metrics_name_verdicts_failure_modes_and_kinds():
    flat = flat_metrics(eval_metrics(TRIALS), TRIALS, KINDS)
    # t1 passed, t2 failed (both git, scored); t3 infrastructure: not scored
    assert flat["success_rate"] == 0.5 and flat["scored"] == 2.0
    assert (flat["verdict/passed"], flat["verdict/failed"], flat["verdict/sandbox_error"]) == (1.0, 1.0, 1.0)
    assert (flat["failure/agent/failed"], flat["failure/infrastructure/sandbox_error"]) == (1.0, 1.0)
    assert flat["kind/git/success_rate"] == 0.5 and "kind/data-wrangling/success_rate" not in flat  # nothing scored there
    assert flat["steps_mean"] == 3.0  # scored trials: (2 + 4) / 2


def test_the_markdown_has_each_section_and_a_row_per_task_and_the_plots_are_pngs():
    text = report_markdown("Eval e", eval_metrics(TRIALS), TRIALS, KINDS, {"t3": 2}, [("agent", "a")])
    assert text.startswith("# Eval e\n\n- agent: `a`")
    for heading in ("## Summary", "## Steps and duration", "## Tool calls", "## Failure modes", "## By task kind", "## Plots"):
        assert heading in text
    assert "| infrastructure | sandbox_error | 1 |" in text and "| git | 2 | 2 | 1 | 0.500 |" in text
    assert "| t3 | data-wrangling | sandbox_error |  | 1 | 2 | 1.00 | why \\| not |" in text  # a | in a detail is escaped
    plots = report_plots(TRIALS, KINDS)
    assert set(plots) == {"verdicts_by_kind.png", "steps_histogram.png"} and all(p.startswith(PNG_MAGIC) for p in plots.values())


def test_an_eval_is_one_mlflow_run_with_metrics_per_session_and_the_report(tmp_path):
    tracker = build_eval_tracker(f"sqlite:///{tmp_path / 'mlruns.db'}")
    info = EvalInfo(eval_id="e1", agent="a", backend="bwrap", tasks_dir="", task_ids=("t1", "t2", "t3"), max_attempts=3,
                    command_timeout_s=120.0, created_at_ms=0)
    first = EvalReport("a", "bwrap", TRIALS, eval_metrics(TRIALS), "e1", {})
    tracked = track_eval(tracker, info, first, 0, KINDS, "/lake", workers=2)
    assert tracked.report_uri.endswith(REPORT_FILE) and tracked.report_uri.startswith("file://")
    # a resume: t3 retried and passed -> 2 of 3 scored passed; the same run, the point at step 1
    resumed = (*TRIALS[:2], trial("t3", TrialVerdict.PASSED, 1))
    again = track_eval(tracker, info, EvalReport("a", "bwrap", resumed, eval_metrics(resumed), "e1", {}), 1, KINDS, "/lake", 2)
    assert again.mlflow_run_id == tracked.mlflow_run_id
    client = MlflowClient(tracking_uri=tracker.uri)
    history = [(p.step, p.value) for p in client.get_metric_history(tracked.mlflow_run_id, "success_rate")]
    assert sorted(history) == [(0, 0.5), (1, 2 / 3)]
    run = client.get_run(tracked.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.data.params["agent"] == "a" and run.data.tags["rlpipe.eval_id"] == "e1"
    listed = {a.path for a in client.list_artifacts(tracked.mlflow_run_id, "report/plots")}
    assert listed == {"report/plots/verdicts_by_kind.png", "report/plots/steps_histogram.png"}
    report = Path(client.download_artifacts(tracked.mlflow_run_id, REPORT_FILE, str(tmp_path))).read_text()
    assert "success rate **0.667**" in report and "- session: `1`" in report  # the resumed session's report replaced the first
