"""Tasks around the RL steps: open a run, warm-start, evaluate on held-out tasks,
checkpoint, and restore a run from the lake (checkpoint + replay of committed steps).

The heavy work runs in the run's workers (rlpipe/workers/): the warm-start, checkpoints and
the restore in the trainer worker, which reads and writes the lake itself; evaluations in
the engine worker. These tasks send references (run id, step, versions) and record what
came back."""

from __future__ import annotations

import dataclasses
import json
import time

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from rlpipe import __version__
from rlpipe.controller.agent_episodes import is_multi_turn, oracle_examples
from rlpipe.controller.evaluation import earlier_evaluations, greedy_accuracy, heldout_metrics, warmstart_accuracy
from rlpipe.controller.runtime import Runtime
from rlpipe.controller.weight_sync import sync_weights
from rlpipe.core.config import config_changes, config_from_dict
from rlpipe.core.errors import ConfigError, StorageUnavailable
from rlpipe.core.records import SCHEMA_VERSION
from rlpipe.core.seeds import derive_seed
from rlpipe.orchestration.stage_options import UNCACHED_STAGE_OPTIONS
from rlpipe.orchestration.status import WarmStartProgress
from rlpipe.orchestration.track import MODEL_ARTIFACT, alert_regressions, artifact_key, log_final_policy, log_step
from rlpipe.rl.heldout_regression import Evaluation, find_regressions
from rlpipe.storage.lake_records import RunInfo
from rlpipe.workers.protocol import WarmStartBegin


@task(name="open-run", **UNCACHED_STAGE_OPTIONS)
def open_run(runtime: Runtime) -> bool:
    """Write run.json and start the MLflow run for a new run, or reopen both for an
    existing one. Returns True when the run already existed (a resume)."""
    records = runtime.records
    run_id = runtime.run_id
    info = records.lake.read_run_info(run_id)
    resumed = info is not None
    if info is None:
        mlflow_run_id = records.tracker.start_run(
            run_name=run_id,
            tags={"rlpipe.run_id": run_id, "rlpipe.lake_uri": records.lake.uri},
            params=runtime.config.flat(),
        )
        info = RunInfo(
            run_id=run_id,
            config_json=runtime.config.model_dump_json(),
            config_hash=runtime.config.config_hash(),
            code_version=__version__,
            created_at_ms=int(time.time() * 1000),
            mlflow_run_id=mlflow_run_id,
            prefect_flow_run_id=str(flow_run.get_id() or ""),
        )
        records.lake.write_run_info(info)
        try:  # an artifact store that fails answers within seconds (storage/tracking.py); the run goes on
            records.tracker.log_text(mlflow_run_id, runtime.config.model_dump_json(indent=2), "config.json")
        except StorageUnavailable as exc:
            get_run_logger().warning("could not upload config.json to MLflow (run.json in the lake has it): %s", exc)
    if resumed:
        records.tracker.resume_run(info.mlflow_run_id)
    if resumed and info.config_hash != runtime.config.config_hash():
        raise ConfigError(
            f"run {run_id!r} was started with config {info.config_hash}; this flow run has {runtime.config.config_hash()}",
            "resume a run with its own config (`rlpipe resume RUN_ID`), or start a new run id",
        )
    if resumed and _resumable_changes(info, runtime):
        # Resumed with more steps (or another checkpoint/eval interval): run.json says what the
        # run now is, so `runs show` and a later plain `rlpipe resume` go on to the new count.
        info = dataclasses.replace(info, config_json=runtime.config.model_dump_json())
        records.lake.write_run_info(info)
    records.mlflow_run_id = info.mlflow_run_id
    records.incarnation = str(info.created_at_ms)
    records.tracker.set_tags(info.mlflow_run_id, {"prefect.flow_run_id": str(flow_run.get_id() or "")})
    return resumed


def _resumable_changes(info: RunInfo, runtime: Runtime) -> list[tuple[str, str | None, str | None]]:
    """What differs between run.json and this flow run's config, beyond where it is stored or tracked."""
    stored = config_from_dict(json.loads(info.config_json))
    return [change for change in config_changes(stored, runtime.config) if not change[0].startswith(("storage.", "tracking."))]


# No retries: a retry would go on from half-trained weights. The run fails instead, and a
# resume warm-starts the freshly built policy again, deterministically.
@task(name="warm-start", retries=0, cache_policy=NO_CACHE)
def warm_start(runtime: Runtime) -> float:
    """Supervised steps on reference answers in the trainer worker (at most
    `warmstart.steps`, fewer when `warmstart.target_accuracy` is reached on training tasks);
    return the last loss. At each accuracy check the trainer waits while the controller
    syncs its weights into the engine worker and measures greedy accuracy there. Progress
    (steps, loss, accuracy checks) goes to MLflow and the lake as it runs."""
    workers = runtime.workers
    config = runtime.config
    tasks = runtime.mixture.sample(config.envs.train_size, rng_seed=derive_seed(config.seed, 0, "warmstart"))
    episodic = [t for t in tasks if is_multi_turn(runtime.mixture.env_for(t))]
    examples = tuple((t.prompt, t.reference_answer) for t in tasks
                     if t.reference_answer is not None and not is_multi_turn(runtime.mixture.env_for(t)))
    if episodic:  # multi-turn domains: every reply of an oracle episode played in the pool (train tasks only)
        examples += tuple(oracle_examples(runtime, episodic))
    progress = WarmStartProgress(runtime, config.warmstart.steps, config.warmstart.target_accuracy)
    target = config.warmstart.target_accuracy
    check_tasks = [] if target is None else runtime.mixture.sample(
        config.warmstart.check_tasks, rng_seed=derive_seed(config.seed, 0, "warmstart-check"))
    runtime.progress.warm_start_begun = True
    workers.trainer.warm_start_begin(WarmStartBegin(
        examples=examples, steps=config.warmstart.steps, batch_size=config.warmstart.batch_size,
        lr=config.warmstart.lr, seed=derive_seed(config.seed, 0, "warmstart-order"),
        check_every=config.warmstart.check_every_steps, with_checks=target is not None,
        keep_optimizer=config.warmstart.keep_optimizer,
    ))
    last_loss = float("nan")
    while True:
        state = workers.trainer.warm_start_wait(timeout_s=1.0)
        for step, loss in state.losses:
            progress.step(step, loss)
            last_loss = loss
        if state.state == "done":
            break
        if state.state == "check":
            sync_weights(runtime)
            result = greedy_accuracy(runtime, check_tasks)
            accuracy = warmstart_accuracy(result, config.warmstart.target_scope)
            get_run_logger().info("warm-start step %d: greedy accuracy on training tasks %.3f (%s)", state.check_step,
                                  accuracy, ", ".join(f"{key.removeprefix('accuracy/')} {value:.2f}"
                                                      for key, value in result.items() if key.startswith("accuracy/")))
            progress.checked(state.check_step, accuracy, {key.removeprefix("accuracy/"): value
                                                          for key, value in result.items() if key.startswith("accuracy/")})
            workers.trainer.warm_start_continue(stop=accuracy >= target)
    progress.finish()
    workers.trainer.reset_reference()  # the KL anchor is the warm-started policy
    sync_weights(runtime)
    return last_loss


FINAL_EVAL = "after_rl"


@task(name="evaluate", task_run_name="evaluate-{name}", **UNCACHED_STAGE_OPTIONS)
def evaluate(runtime: Runtime, name: str) -> dict[str, float]:
    """Greedy pass@1 on the held-out tasks, overall and per domain; stored in the lake
    under `name` (e.g. before_rl, after_rl) and logged to MLflow (`heldout_metrics`). A
    domain more than eval.regression_threshold below its best of the previous
    eval.regression_window evaluations raises an alert (orchestration/track.py `alert_regressions`;
    the run goes on).

    A stored result is returned as is (the run was interrupted after it: the lake is the
    truth), except a stored after_rl of another policy version: the run was extended after
    its final evaluation, and the final policy is now a newer one. Every other name
    (before_rl, step_N) is a fixed point of the run."""
    records, progress = runtime.records, runtime.progress
    run_id = runtime.run_id
    stored = records.lake.read_json(run_id, f"evals/{name}.json")
    stale = name == FINAL_EVAL and stored is not None and stored.get("policy_version") != progress.policy_version
    if stored is not None and not stale:
        return {key: float(value) for key, value in stored.items() if key != "policy_version"}
    if progress.engine_version != progress.policy_version:  # async runs: the engine may hold an older version
        sync_weights(runtime)
    result = greedy_accuracy(runtime, runtime.heldout)
    # MLflow and the alert first: the stored result makes a re-run return early, and the
    # tracker skips a point it has already, so a kill between them loses nothing.
    records.tracker.log_step_metrics(records.mlflow_run_id, progress.policy_version, heldout_metrics(result), timestamp_ms=None)
    current = Evaluation.from_result(name, progress.policy_version, result)
    settings = runtime.config.eval
    alert_regressions(runtime, find_regressions(earlier_evaluations(runtime, current), current, settings.regression_threshold,
                                                settings.regression_window, settings.regression_z, runtime.config.envs.heldout_size))
    records.lake.write_json(run_id, f"evals/{name}.json", {"policy_version": progress.policy_version, **result})
    return result


@task(name="checkpoint", task_run_name="checkpoint-step-{step}", **UNCACHED_STAGE_OPTIONS)
def checkpoint(runtime: Runtime, step: int) -> None:
    """The trainer worker snapshots its state for `step` and writes it into the lake in the
    background (an HF model folder with the trainer state beside it); CHECKPOINT.json and then
    LATEST are written last (workers/checkpoint_writer.py). The steps' MLflow log is waited
    for first: a resume from this checkpoint does not replay its steps, so a log in flight
    that a crash cut would never be sent again."""
    runtime.records.tracker.settle()
    runtime.workers.trainer.save_checkpoint(step, runtime.config.config_hash())
    runtime.progress.trainer_in_lake = True


def _checkpoint_uri(runtime: Runtime, run_id: str, step: int) -> str:
    return f"{runtime.records.lake.uri.rstrip('/')}/checkpoints/{run_id}/step={step:06d}"


def _refuse_old_schema(runtime: Runtime, run_id: str, step: int) -> None:
    """ConfigError when committed step `step` holds rows of an older trajectory schema: their
    logprobs follow another convention, so replaying or continuing the run would be wrong."""
    records = runtime.records
    manifest = records.lake.read_manifest(run_id, step)
    parts = manifest.parts if manifest else ()
    versions = records.lake.read_parts_table(parts, columns=("schema_version",)).column("schema_version").to_pylist()
    oldest = min(versions, default=SCHEMA_VERSION)
    if oldest < SCHEMA_VERSION:
        raise ConfigError(
            f"run {run_id!r} holds trajectories of schema version {oldest} (step {step}); this rlpipe writes and trains on version {SCHEMA_VERSION}",
            f"start a new run (a new --run-id); runs from before version {SCHEMA_VERSION} stored temperature-1 logprobs, "
            "which the trainer no longer matches",
        )


@task(name="restore", **UNCACHED_STAGE_OPTIONS)
def restore(runtime: Runtime) -> int:
    """Bring the trainer worker to the last committed step C (async runs: to C - k, the
    version that generates step C + 1; steps C-k+1..C are then trained from their committed
    rows): it loads the newest intact checkpoint at or before it and replays the updates of
    the committed steps after it from the stored rows; then the engine gets its weights.
    Returns the step the trainer is at (0 when no RL step is committed yet; -1 when there
    is no checkpoint: start over)."""
    progress = runtime.progress
    run_id = runtime.run_id
    committed = runtime.records.lake.committed_steps(run_id)
    if committed:
        _refuse_old_schema(runtime, run_id, committed[0])
    # async runs: the next step to generate (last committed + 1) needs the version k behind it
    target = max(0, committed[-1] - runtime.config.rollout.max_staleness) if committed else None
    result = runtime.workers.trainer.restore(target, runtime.config.seed)
    if result.last_committed < 0:
        return -1  # not even the warm-start finished: start over from the warm-start
    for line in result.fallbacks:
        get_run_logger().warning(line)
    progress.policy_version = result.policy_version
    progress.trainer_in_lake = True
    for replayed, train_metrics in sorted(result.replayed.items()):
        log_step(runtime, replayed, train_metrics)
    sync_weights(runtime)
    return result.last_committed


@task(name="finish", **UNCACHED_STAGE_OPTIONS)
def finish(runtime: Runtime, before: float, after: float) -> dict[str, object]:
    """Reward curve and end of the MLflow run, the Prefect summary; returns the summary."""
    records = runtime.records
    run_id = runtime.run_id
    tracker, lake = records.tracker, records.lake
    steps_committed = len(lake.committed_steps(run_id))
    final_step = lake.latest_checkpoint(run_id)
    try:  # a failing artifact store: a warning within seconds, never a hung or failed end of run
        tracker.log_reward_curve(records.mlflow_run_id, lake, run_id)
    except StorageUnavailable as exc:
        get_run_logger().warning("could not upload the reward curve to MLflow: %s", exc)
    tracker.log_step_metrics(
        records.mlflow_run_id, runtime.progress.policy_version, {"heldout/accuracy_gain": after - before}, timestamp_ms=None
    )
    model_logged = log_final_policy(runtime, final_step)  # MLflow artifacts model/: an HF folder (best effort)
    tracker.end_run(records.mlflow_run_id, "FINISHED")
    url = tracker.run_url(records.mlflow_run_id)
    mlflow_line = (
        f"MLflow run: [{records.mlflow_run_id}]({url})" if url
        else f"MLflow run `{records.mlflow_run_id}` in `{tracker.uri}` (view: `mlflow ui --backend-store-uri {tracker.uri}`)"
    )
    checkpoint = _checkpoint_uri(runtime, run_id, final_step)  # an HF model folder (rl/checkpoint_layout.py)
    create_markdown_artifact(
        key=f"rlpipe-summary-{artifact_key(run_id)}",
        markdown=(
            f"# RL run `{run_id}`\n\n| held-out accuracy (greedy pass@1) | value |\n|---|---|\n"
            f"| before RL | {before:.3f} |\n| after RL | {after:.3f} |\n| change | {after - before:+.3f} |\n\n"
            f"Steps committed: {steps_committed}. Lake: `{lake.uri}`. Final policy (HF folder): `{checkpoint}`"
            f"{f', and the MLflow run artifacts `{MODEL_ARTIFACT}/`' if model_logged else ''}.\n\n"
            f"{mlflow_line}\n"
        ),
        description=f"Summary of run {run_id}",
    )
    return dict(
        run_id=run_id, lake_uri=lake.uri, tracking_uri=tracker.uri, mlflow_run_id=records.mlflow_run_id,
        mlflow_run_url=url, steps_committed=steps_committed, accuracy_before_rl=before,
        accuracy_after_rl=after, final_checkpoint=checkpoint,
    )

