"""Stage task `track`: store a committed step's after-commit metrics (the update's, the
timings) in the lake beside its manifest (TRAIN.json), log all its metrics to MLflow
(timestamps from the step manifest, so a retried or resumed step adds no duplicate point)
and refresh the Prefect table artifact of step metrics.

With the curriculum on, the step's domain ratios are logged and kept in TRAIN.json too
(`curriculum/ratio/<domain>`).

The table holds every committed step, also after a resume: the first `track` of a process
rebuilds the rows of the steps before it from the lake (manifests and TRAIN.json).

`alert_regressions` raises the held-out regression alert that `evaluate` finds."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from rlpipe.rl.heldout_regression import Regression
from rlpipe.tasks.runtime import Runtime, get_runtime, step_ratios
from rlpipe.tasks.stage_options import UNCACHED_STAGE_OPTIONS

SHOWN = ("step", "reward/mean", "train/loss", "train/kl", "train/grad_norm", "time/step_s")


def log_step(runtime: Runtime, step: int, extra: dict[str, float]) -> dict[str, float]:
    """Log manifest metrics + `extra` (+ the curriculum's ratios of the step, when it is on:
    `curriculum/ratio/<domain>`, recomputed from the lake, so a replayed step logs the same)
    for `step`; return everything logged."""
    manifest = runtime.lake.read_manifest(runtime.run_id, step)
    ratios = step_ratios(runtime, step)
    if ratios is not None:
        extra = {**extra, **{f"curriculum/ratio/{domain}": ratio for domain, ratio in sorted(ratios.items())}}
    if extra:  # the update's and the timings, beside the manifest: the step_metrics view joins them
        runtime.lake.record_train_metrics(runtime.run_id, step, extra)
    metrics = {**dict(manifest.metrics), **extra}
    if metrics.get("time/generate_s") and "rollout/tokens" in metrics:
        metrics["throughput/tokens_per_s"] = metrics["rollout/tokens"] / metrics["time/generate_s"]
    runtime.tracker.log_step_metrics(runtime.mlflow_run_id, step, metrics, timestamp_ms=manifest.committed_at_ms)
    return metrics


@task(name="track", task_run_name="track-step-{step}", **UNCACHED_STAGE_OPTIONS)
def track(run_id: str, step: int, extra: dict[str, float]) -> None:
    runtime = get_runtime(run_id)
    metrics = log_step(runtime, step, extra)
    if not runtime.step_metrics:
        runtime.step_metrics.extend(earlier_rows(runtime, step))
    runtime.step_metrics[:] = [row for row in runtime.step_metrics if row["step"] != step]  # a retried track
    runtime.step_metrics.append({"step": step, **metrics})
    create_table_artifact(
        key=f"rlpipe-steps-{artifact_key(run_id)}",
        table=[{name: round(row.get(name, float("nan")), 4) for name in SHOWN} for row in runtime.step_metrics],
        description=f"Step metrics of run {run_id} (updated each step)",
    )


def earlier_rows(runtime: Runtime, step: int) -> list[dict[str, float]]:
    """The table rows of the committed steps before `step`, from the lake alone: each
    manifest's metrics and the TRAIN.json beside it (train/*, time/*)."""
    rows = []
    for earlier in (s for s in runtime.lake.committed_steps(runtime.run_id) if s < step):
        row = {"step": earlier, **dict(runtime.lake.read_manifest(runtime.run_id, earlier).metrics)}
        train = runtime.lake.read_train_metrics(runtime.run_id, earlier)
        rows.append({**row, **(dict(train.metrics) if train else {})})
    return rows


def alert_regressions(runtime: Runtime, regressions: list[Regression]) -> None:
    """A held-out regression: a warning line each, the MLflow tag `regression.<domain>` (the
    line), and the run's Prefect markdown artifact `rlpipe-regression-<run>` (a new version
    per evaluation that finds one). It never stops the run."""
    if not regressions:
        return
    logger = get_run_logger()
    for regression in regressions:
        logger.warning("regression: %s", regression.line())
    at = regressions[0].at
    rows = "".join(f"| {r.domain} | {r.best:.3f} ({r.best_at.name}) | {r.now:.3f} | {-r.drop:+.3f} |\n" for r in regressions)
    try:
        runtime.tracker.set_tags(runtime.mlflow_run_id, {f"regression.{r.domain}": r.line() for r in regressions})
        create_markdown_artifact(
            key=f"rlpipe-regression-{artifact_key(runtime.run_id)}",
            markdown=(f"# Held-out regression in run `{runtime.run_id}` at {at.name} (policy version {at.policy_version})\n\n"
                      f"Threshold {runtime.config.eval.regression_threshold} over the previous "
                      f"{runtime.config.eval.regression_window} evaluations. The run goes on.\n\n"
                      f"| domain | best before | now | change |\n|---|---|---|---|\n{rows}"),
            description=f"Held-out accuracy regressions of run {runtime.run_id}",
        )
    except Exception as exc:  # noqa: BLE001 - an alert that cannot be recorded must not stop the run
        logger.warning("could not record the regression alert in MLflow/Prefect: %s", exc)


def artifact_key(run_id: str) -> str:
    """Prefect artifact keys take lowercase letters, digits and dashes only."""
    return "".join(ch if ch.isalnum() or ch == "-" else "-" for ch in run_id.lower())
