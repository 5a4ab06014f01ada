"""An eval as an MLflow run: its metrics, its report (markdown) and its plots (PNG).

One MLflow run per eval, tagged `rlpipe.eval_id`; a resumed eval (`--resume`, a new
process) finds its run by that tag and logs on into it. The metrics of each session are
logged at step = the session number (0 for the first, 1 for the first resume, ...), so the
latest point of every metric is the eval's current result and earlier sessions stay in
the history. The params are the eval's settings (agent, backend, task folder, attempts,
command timeout, workers); the report goes to `report/eval_report.md` and the plots to
`report/plots/*.png` (a resumed session replaces them).

What it does not do: run trials or compute metrics (rlpipe/agents/), or decide when to
log (the rl-eval flow, rlpipe/flows/eval.py, calls it once at the end of a session).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from rlpipe.agents.evaluation import EvalReport
from rlpipe.agents.report import flat_metrics, report_markdown, report_plots
from rlpipe.storage.eval_records import EvalInfo
from rlpipe.storage.tracking import Tracker, resolve_tracking_uri

DEFAULT_EVAL_EXPERIMENT = "rlpipe-eval"
EVAL_ID_TAG = "rlpipe.eval_id"
REPORT_FILE = "report/eval_report.md"


@dataclass(frozen=True)
class EvalTracking:
    """Where an eval was tracked."""

    tracking_uri: str
    mlflow_run_id: str
    mlflow_run_url: str | None  # the MLflow UI page (http servers only)
    report_uri: str  # the markdown report's artifact URI


def build_eval_tracker(mlflow_uri: str | None, experiment: str = DEFAULT_EVAL_EXPERIMENT) -> Tracker:
    """The tracker of `mlflow_uri` (None: `rlpipe up`'s MLflow if it runs, else ./mlruns.db)."""
    return Tracker(resolve_tracking_uri(mlflow_uri), experiment)


def track_eval(tracker: Tracker, info: EvalInfo, report: EvalReport, session: int, kinds: Mapping[str, str],
               lake_uri: str, workers: int, extra_tags: Mapping[str, str] | None = None) -> EvalTracking:
    """Log one session of an eval to its MLflow run (created on the first session); finish it."""
    run_id = tracker.find_run(EVAL_ID_TAG, info.eval_id)
    tags = {EVAL_ID_TAG: info.eval_id, "rlpipe.lake_uri": lake_uri, "rlpipe.agent": info.agent,
            "rlpipe.backend": info.backend, **(extra_tags or {})}
    if run_id is None:
        params = {"agent": info.agent, "backend": info.backend, "tasks_dir": info.tasks_dir or "(built-in suite)",
                  "tasks": len(info.task_ids), "max_attempts": info.max_attempts,
                  "command_timeout_s": info.command_timeout_s, "workers": workers}
        run_id = tracker.start_run(info.eval_id, tags, params)
    else:
        tracker.resume_run(run_id)
        tracker.set_tags(run_id, tags)
    tracker.log_step_metrics(run_id, session, flat_metrics(report.metrics, report.trials, kinds),
                             timestamp_ms=int(time.time() * 1000))
    attempts = {task_id: len(history) for task_id, history in report.attempts.items()}
    facts = [("agent", info.agent), ("backend", info.backend), ("tasks", info.tasks_dir or "the built-in suite"),
             ("session", str(session)), ("lake", lake_uri), ("MLflow run", run_id),
             ("query", f"rlpipe query --lake {lake_uri} \"select * from eval_trials where eval_id = '{info.eval_id}' and final\"")]
    facts += [(key, value) for key, value in (extra_tags or {}).items()]
    markdown = report_markdown(f"Eval {info.eval_id}", report.metrics, report.trials, kinds, attempts, facts)
    tracker.log_text(run_id, markdown, REPORT_FILE)
    for name, png in report_plots(report.trials, kinds).items():
        tracker.log_bytes(run_id, png, f"report/plots/{name}")
    tracker.end_run(run_id, "FINISHED")
    return EvalTracking(tracker.uri, run_id, tracker.run_url(run_id), tracker.artifact_uri(run_id, REPORT_FILE))
