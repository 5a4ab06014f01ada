"""Stage task `track`: store a committed step's after-commit metrics (the update's, the
timings) in the lake beside its manifest (TRAIN.json), log all its metrics to MLflow
(timestamps from the step manifest, so a retried or resumed step adds no duplicate point)
and refresh the Prefect table artifact of step metrics."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_table_artifact

from rlpipe.tasks.runtime import Runtime, get_runtime
from rlpipe.tasks.stage_options import STAGE_OPTIONS


def log_step(runtime: Runtime, step: int, extra: dict[str, float]) -> dict[str, float]:
    """Log manifest metrics + `extra` for `step`; return everything logged."""
    manifest = runtime.lake.read_manifest(runtime.run_id, step)
    if extra:  # the update's and the timings, beside the manifest: the step_metrics view joins them
        runtime.lake.record_train_metrics(runtime.run_id, step, extra)
    metrics = {**dict(manifest.metrics), **extra}
    if metrics.get("time/generate_s") and "rollout/tokens" in metrics:
        metrics["throughput/tokens_per_s"] = metrics["rollout/tokens"] / metrics["time/generate_s"]
    runtime.tracker.log_step_metrics(runtime.mlflow_run_id, step, metrics, timestamp_ms=manifest.committed_at_ms)
    return metrics


@task(name="track", **STAGE_OPTIONS)
def track(run_id: str, step: int, extra: dict[str, float]) -> None:
    runtime = get_runtime(run_id)
    metrics = log_step(runtime, step, extra)
    runtime.step_metrics.append({"step": step, **metrics})
    shown = ("step", "reward/mean", "train/loss", "train/kl", "train/grad_norm", "time/step_s")
    create_table_artifact(
        key=f"rlpipe-steps-{artifact_key(run_id)}",
        table=[{name: round(row.get(name, float("nan")), 4) for name in shown} for row in runtime.step_metrics],
        description=f"Step metrics of run {run_id} (updated each step)",
    )


def artifact_key(run_id: str) -> str:
    """Prefect artifact keys take lowercase letters, digits and dashes only."""
    return "".join(ch if ch.isalnum() or ch == "-" else "-" for ch in run_id.lower())
