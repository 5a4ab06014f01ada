"""Stage `track` (the last of a step, tasks/step_tasks.py): store a committed
step's after-commit metrics (the update's, the timings) in the lake beside its manifest
(TRAIN.json), log all its metrics to MLflow (timestamps from the step manifest, so a
retried or resumed step adds no duplicate point; on the tracker's own thread, so the next
step need not wait for MLflow's write: a failed log is raised by the next step's `track`
or the run's end, storage/step_log_thread.py) and refresh the Prefect table artifact of
step metrics (at most every TABLE_REFRESH_S, and at the last step).

With the curriculum on, the step's domain ratios are logged and kept in TRAIN.json too
(`curriculum/ratio/<domain>`).

The table holds every committed step, also after a resume: the first `track` of a process
rebuilds the rows of the steps before it from the lake (manifests and TRAIN.json).

`alert_regressions` raises the held-out regression alert that `evaluate` finds.

`link_runs` cross-links a run's records once its flow run starts (MLflow tags and
description -> the Prefect flow run and the lake; a Prefect artifact -> the MLflow run), and
`log_final_policy` logs the final policy to the MLflow run as the artifact folder `model/`
(a Hugging Face folder, workers/policy_export.py) and as a logged model registered under the
run id (storage/mlflow_model.py) at the end of a run. Both are best effort:
what cannot be recorded is a warning, never a failed or hanging run."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from rlpipe.controller.runtime import Runtime
from rlpipe.controller.sample import step_ratios
from rlpipe.orchestration.run_log import log_rl_step, run_logger
from rlpipe.rl.heldout_regression import Regression
from rlpipe.workers.policy_export import export_policy

if TYPE_CHECKING:
    from rlpipe.storage.lake import Lake
    from rlpipe.storage.tracking import Tracker

MODEL_ARTIFACT = "model"  # the final policy among the MLflow run's artifacts: an HF folder
SHOWN = ("step", "reward/mean", "train/loss", "train/kl", "train/grad_norm", "time/step_s")
TABLE_REFRESH_S = 5.0
"""The step table is a new artifact version of every row, so it is refreshed at the first
step a process tracks, then at most this often, and at the run's last step: a refresh is a
Prefect API call and server work on the step's path, a cost a small step cannot spare
(docs/RESULTS.md, "The CLI's whole step beside the loop and TRL"), and its rows grow with
the run. The lake and MLflow get every step at once."""


def log_step(runtime: Runtime, step: int, extra: dict[str, float]) -> dict[str, float]:
    """Log manifest metrics + `extra` (+ the curriculum's ratios of the step, when it is on:
    `curriculum/ratio/<domain>`, recomputed from the lake, so a replayed step logs the same)
    for `step`; return everything logged."""
    records = runtime.records
    manifest = records.lake.read_manifest(runtime.run_id, step)
    ratios = step_ratios(runtime, step)
    if ratios is not None:
        extra = {**extra, **{f"curriculum/ratio/{domain}": ratio for domain, ratio in sorted(ratios.items())}}
    if extra:  # the update's and the timings, beside the manifest: the step_metrics view joins them
        # merged with what an earlier attempt stored: a replayed step (resumed from an older
        # checkpoint) logs the timings its first run measured, which a kill may have cut from
        # that run's MLflow log in flight (points MLflow has are skipped)
        extra = dict(records.lake.record_train_metrics(runtime.run_id, step, extra).metrics)
    metrics = {**dict(manifest.metrics), **extra}
    if metrics.get("time/generate_s") and "rollout/tokens" in metrics:
        metrics["throughput/tokens_per_s"] = metrics["rollout/tokens"] / metrics["time/generate_s"]
    # off the step's path: the next step goes on while MLflow writes (`end_run` waits for it)
    records.tracker.log_step_metrics_soon(records.mlflow_run_id, step, metrics, timestamp_ms=manifest.committed_at_ms)
    return metrics


def track(runtime: Runtime, step: int, extra: dict[str, float]) -> None:
    records = runtime.records
    run_id = runtime.run_id
    metrics = log_step(runtime, step, extra)
    log_rl_step(step, runtime.config.train.steps, metrics)  # the step's line in the flow run's logs
    if not records.step_metrics:
        records.step_metrics.extend(earlier_rows(runtime, step))
    records.step_metrics[:] = [row for row in records.step_metrics if row["step"] != step]  # a retried track
    records.step_metrics.append({"step": step, **metrics})
    now = time.monotonic()
    if table_due(records.table_refreshed_at, now, step, runtime.config.train.steps):
        create_table_artifact(
            key=f"rlpipe-steps-{artifact_key(run_id)}",
            table=[{name: round(row.get(name, float("nan")), 4) for name in SHOWN} for row in records.step_metrics],
            description=f"Step metrics of run {run_id} (refreshed every {TABLE_REFRESH_S:g} s and at the last step)",
        )
        records.table_refreshed_at = now


def table_due(refreshed_at: float | None, now: float, step: int, last_step: int) -> bool:
    """Whether `track` refreshes the step table now (TABLE_REFRESH_S)."""
    return refreshed_at is None or now - refreshed_at >= TABLE_REFRESH_S or step >= last_step


def earlier_rows(runtime: Runtime, step: int) -> list[dict[str, float]]:
    """The table rows of the committed steps before `step`, from the lake alone: each
    manifest's metrics and the TRAIN.json beside it (train/*, time/*)."""
    records = runtime.records
    rows = []
    for earlier in (s for s in records.lake.committed_steps(runtime.run_id) if s < step):
        row = {"step": earlier, **dict(records.lake.read_manifest(runtime.run_id, earlier).metrics)}
        train = records.lake.read_train_metrics(runtime.run_id, earlier)
        rows.append({**row, **(dict(train.metrics) if train else {})})
    return rows


def alert_regressions(runtime: Runtime, regressions: list[Regression]) -> None:
    """A held-out regression: a warning line each, the MLflow tag `regression.<domain>` (the
    line), and the run's Prefect markdown artifact `rlpipe-regression-<run>` (a new version
    per evaluation that finds one). It never stops the run."""
    records = runtime.records
    if not regressions:
        return
    logger = get_run_logger()
    for regression in regressions:
        logger.warning("regression: %s", regression.line())
    at = regressions[0].at
    rows = "".join(f"| {r.domain} | {r.best:.3f} ({r.best_at.name}) | {r.now:.3f} | {-r.drop:+.3f} |\n" for r in regressions)
    try:
        records.tracker.set_tags(records.mlflow_run_id, {f"regression.{r.domain}": r.line() for r in regressions})
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


def link_runs(runtime: Runtime, links: Mapping[str, str | None]) -> None:
    """Cross-link the run's records (`links` as orchestration/status.py `record_links` made them):
    MLflow tags prefect.flow_run_id, prefect.flow_run_url (when a Prefect server with a UI is
    known), rlpipe.lake_uri, rlpipe.run_uri and rlpipe.checkpoints_uri, and the same as the
    MLflow run's description; the Prefect markdown artifact `rlpipe-links-<run>` with the
    MLflow run (its UI URL, else the tracking URI and run id) and the lake URIs."""
    records = runtime.records
    lake_uri, run_id = records.lake.uri.rstrip("/"), runtime.run_id
    lake_uris = {"rlpipe.lake_uri": records.lake.uri, "rlpipe.run_uri": f"{lake_uri}/runs/{run_id}",
                 "rlpipe.checkpoints_uri": f"{lake_uri}/checkpoints/{run_id}"}
    flow_run_id, flow_run_url = links.get("prefect_flow_run_id") or "", links.get("prefect_flow_run_url")
    prefect = f"[{flow_run_id}]({flow_run_url})" if flow_run_url else f"`{flow_run_id}` (ephemeral server: no UI)"
    lake_lines = "".join(f"- {name.removeprefix('rlpipe.')}: `{uri}`\n" for name, uri in lake_uris.items())
    mlflow_run = links.get("mlflow_run_id") or ""
    mlflow = (f"[{mlflow_run}]({links['mlflow_run_url']})" if links.get("mlflow_run_url")
              else f"`{mlflow_run}` in `{links.get('mlflow_tracking_uri')}`")
    logger = run_logger()
    try:
        records.tracker.set_tags(records.mlflow_run_id, {
            "prefect.flow_run_id": flow_run_id, **({"prefect.flow_run_url": flow_run_url} if flow_run_url else {}), **lake_uris,
            "mlflow.note.content": f"RL run `{run_id}`. Prefect flow run: {prefect}.\n\n{lake_lines}",
        })
    except Exception as exc:  # noqa: BLE001 - links are worth a warning, not a failed run
        logger.warning("could not tag MLflow run %s with its links: %s", records.mlflow_run_id, exc)
    try:
        create_markdown_artifact(key=f"rlpipe-links-{artifact_key(run_id)}", description=f"Where run {run_id} is recorded",
                                 markdown=f"# RL run `{run_id}`\n\nMLflow run: {mlflow}\n\n{lake_lines}")
    except Exception as exc:  # noqa: BLE001
        logger.warning("could not write the Prefect links artifact of run %s: %s", run_id, exc)


def log_final_policy(runtime: Runtime, step: int | None) -> bool:
    """With tracking.log_model (and a checkpoint at `step`): the policy of checkpoint `step`
    as the MLflow run's artifact folder `model/`; see `upload_policy`."""
    records = runtime.records
    tracking = runtime.config.tracking
    if not tracking.log_model or step is None:
        return False
    return upload_policy(records.tracker, records.lake, runtime.run_id, records.mlflow_run_id, step,
                         tracking.log_model_timeout_s)


def upload_policy(tracker: Tracker, lake: Lake, run_id: str, mlflow_run_id: str, step: int, timeout_s: float) -> bool:
    """Export the policy of `run_id` at checkpoint `step` from the lake into a temporary
    folder and upload it as the artifact folder `model/` of MLflow run `mlflow_run_id` and
    as an MLflow logged model (pyfunc, storage/mlflow_model.py) registered under the run id,
    then tag the run rlpipe.model_step, rlpipe.logged_model_id and rlpipe.registered_model. True when done. A failed upload, or one still going after
    `timeout_s` (it goes on in the background until the process ends), is a warning and
    False: the run is finished whatever happens here."""
    failures: list[BaseException] = []

    def upload() -> None:
        try:
            with tempfile.TemporaryDirectory(prefix="rlpipe-model-") as folder:
                exported = export_policy(lake, run_id, Path(folder) / MODEL_ARTIFACT, step)
                tracker.log_artifact(mlflow_run_id, exported.folder)  # a folder: uploaded as model/
                logged = tracker.log_policy_model(mlflow_run_id, exported.folder, run_id, step)  # "Logged models", registered
            tracker.set_tags(mlflow_run_id, {"rlpipe.model_step": str(step), "rlpipe.logged_model_id": logged.model_id,
                                             "rlpipe.registered_model": f"{logged.registered_name}/{logged.version}"})
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    worker = threading.Thread(target=upload, name=f"log-model-{run_id}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        run_logger().warning("the final policy of run %s is still uploading to MLflow after %.0f s (tracking.log_model_timeout_s); "
                          "the run goes on without waiting; export it with `rlpipe export %s DIR --lake %s`",
                          run_id, timeout_s, run_id, lake.uri)
        return False
    if failures:
        run_logger().warning("could not log the final policy of run %s to MLflow: %s; export it with `rlpipe export %s DIR --lake %s`",
                          run_id, failures[0], run_id, lake.uri)
        return False
    return True

