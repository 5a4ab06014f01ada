"""Tasks around the RL steps: open a run, warm-start, evaluate on held-out tasks,
checkpoint, and restore a run from the lake (checkpoint + replay of committed steps)."""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from rlpipe import __version__
from rlpipe.core.config import config_changes, config_from_dict
from rlpipe.core.errors import ConfigError, LakeCorrupted
from rlpipe.core.records import SCHEMA_VERSION, Task
from rlpipe.core.seeds import derive_seed
from rlpipe.engines.base import SamplingParams
from rlpipe.rl.checkpoint import POLICY_DIR, CheckpointMeta, load_checkpoint, load_policy_weights, save_checkpoint
from rlpipe.rl.warmstart import warm_start as supervised_warm_start
from rlpipe.storage.lake_records import RunInfo
from rlpipe.tasks.runtime import Runtime, get_runtime
from rlpipe.tasks.stage_options import STAGE_OPTIONS
from rlpipe.tasks.status import WarmStartProgress
from rlpipe.tasks.track import artifact_key, log_step
from rlpipe.tasks.update import apply_committed_update
from rlpipe.tasks.verify import verify_all


@task(name="open-run", **STAGE_OPTIONS)
def open_run(run_id: str) -> bool:
    """Write run.json and start the MLflow run for a new run, or reopen both for an
    existing one. Returns True when the run already existed (a resume)."""
    runtime = get_runtime(run_id)
    info = runtime.lake.read_run_info(run_id)
    resumed = info is not None
    if info is None:
        mlflow_run_id = runtime.tracker.start_run(
            run_name=run_id,
            tags={"rlpipe.run_id": run_id, "rlpipe.lake_uri": runtime.lake.uri},
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
        runtime.lake.write_run_info(info)
        runtime.tracker.log_text(mlflow_run_id, runtime.config.model_dump_json(indent=2), "config.json")
    if resumed:
        runtime.tracker.resume_run(info.mlflow_run_id)
    if resumed and info.config_hash != runtime.config.config_hash():
        raise ConfigError(
            f"run {run_id!r} was started with config {info.config_hash}; this flow run has {runtime.config.config_hash()}",
            "resume a run with its own config (`rlpipe resume RUN_ID`), or start a new run id",
        )
    if resumed and _resumable_changes(info, runtime):
        # Resumed with more steps (or another checkpoint/eval interval): run.json says what the
        # run now is, so `runs show` and a later plain `rlpipe resume` go on to the new count.
        info = dataclasses.replace(info, config_json=runtime.config.model_dump_json())
        runtime.lake.write_run_info(info)
    runtime.mlflow_run_id = info.mlflow_run_id
    runtime.incarnation = str(info.created_at_ms)
    runtime.tracker.set_tags(info.mlflow_run_id, {"prefect.flow_run_id": str(flow_run.get_id() or "")})
    return resumed


def _resumable_changes(info: RunInfo, runtime: Runtime) -> list[tuple[str, str | None, str | None]]:
    """What differs between run.json and this flow run's config, beyond where it is stored or tracked."""
    stored = config_from_dict(json.loads(info.config_json))
    return [change for change in config_changes(stored, runtime.config) if not change[0].startswith(("storage.", "tracking."))]


# No retries: a retry would go on from half-trained weights. The run fails instead, and a
# resume warm-starts the freshly built policy again, deterministically.
@task(name="warm-start", retries=0)
def warm_start(run_id: str) -> float:
    """Supervised steps on reference answers (at most `warmstart.steps`, fewer when
    `warmstart.target_accuracy` is reached on training tasks); return the last loss.
    Progress (steps, loss, accuracy checks) goes to MLflow and the lake as it runs."""
    runtime = get_runtime(run_id)
    config = runtime.config
    tasks = runtime.mixture.sample(config.envs.train_size, rng_seed=derive_seed(config.seed, 0, "warmstart"))
    examples = [(t.prompt, t.reference_answer) for t in tasks if t.reference_answer is not None]
    progress = WarmStartProgress(run_id, config.warmstart.steps, config.warmstart.target_accuracy)
    stop_check = None
    if config.warmstart.target_accuracy is not None:
        check_tasks = runtime.mixture.sample(config.warmstart.check_tasks, rng_seed=derive_seed(config.seed, 0, "warmstart-check"))

        def stop_check(steps_done: int) -> bool:
            runtime.engine.load_weights(runtime.trainer.named_weights(), 0)
            accuracy = greedy_accuracy(runtime, check_tasks)["accuracy"]
            get_run_logger().info("warm-start step %d: greedy accuracy on training tasks %.3f", steps_done, accuracy)
            progress.checked(steps_done, accuracy)
            return accuracy >= config.warmstart.target_accuracy

    losses = supervised_warm_start(
        runtime.policy,
        runtime.tokenizer,
        examples,
        steps=config.warmstart.steps,
        batch_size=config.warmstart.batch_size,
        lr=config.warmstart.lr,
        seed=derive_seed(config.seed, 0, "warmstart-order"),
        stop_check=stop_check,
        check_every=config.warmstart.check_every_steps,
        on_step=progress.step,
    )
    progress.finish()
    runtime.trainer.reset_reference()  # the KL anchor is the warm-started policy
    runtime.engine.load_weights(runtime.trainer.named_weights(), 0)
    return losses[-1] if losses else float("nan")


def greedy_accuracy(runtime: Runtime, tasks: list[Task]) -> dict[str, float]:
    """Greedy pass@1 of the engine's policy on `tasks`: `accuracy` and `accuracy/<domain>`."""
    params = SamplingParams(
        n=1, temperature=1.0, top_p=1.0, max_new_tokens=runtime.config.rollout.max_new_tokens,
        stop=runtime.config.rollout.stop, seed=0, greedy=True,
    )
    completions = runtime.engine.generate([(t.task_id, t.prompt) for t in tasks], params)
    by_id = {t.task_id: t for t in tasks}
    passed: dict[str, list[float]] = defaultdict(list)
    pairs = [(by_id[completion.task_id], completion.text) for completion in completions]
    for (task_, _), verdict in zip(pairs, verify_all(runtime, pairs)):  # code runs in the run's sandbox pool
        passed[task_.domain].append(1.0 if verdict.passed else 0.0)
    every = [value for values in passed.values() for value in values]
    result = {"accuracy": sum(every) / len(every)}
    result.update({f"accuracy/{domain}": sum(v) / len(v) for domain, v in sorted(passed.items())})
    return result


FINAL_EVAL = "after_rl"


@task(name="evaluate", **STAGE_OPTIONS)
def evaluate(run_id: str, name: str) -> dict[str, float]:
    """Greedy pass@1 on the held-out tasks, overall and per domain; stored in the lake
    under `name` (e.g. before_rl, after_rl) and logged to MLflow.

    A stored result is returned as is (the run was interrupted after it: the lake is the
    truth), except a stored after_rl of another policy version: the run was extended after
    its final evaluation, and the final policy is now a newer one. Every other name
    (before_rl, step_N) is a fixed point of the run."""
    runtime = get_runtime(run_id)
    stored = runtime.lake.read_json(run_id, f"evals/{name}.json")
    stale = name == FINAL_EVAL and stored is not None and stored.get("policy_version") != runtime.policy_version
    if stored is not None and not stale:
        return {key: float(value) for key, value in stored.items() if key != "policy_version"}
    result = greedy_accuracy(runtime, runtime.heldout)
    # MLflow first: the stored result makes a re-run return early, and the tracker skips a
    # point it has already, so a kill between the two loses nothing.
    runtime.tracker.log_step_metrics(
        runtime.mlflow_run_id, runtime.policy_version, {f"heldout/{k}": v for k, v in result.items()},
        timestamp_ms=None,
    )
    runtime.lake.write_json(run_id, f"evals/{name}.json", {"policy_version": runtime.policy_version, **result})
    return result


@task(name="checkpoint", **STAGE_OPTIONS)
def checkpoint(run_id: str, step: int) -> None:
    """Save policy/ (an HF model folder) and trainer/ (optimizer state, meta) for `step`;
    the lake writes CHECKPOINT.json and then LATEST last."""
    runtime = get_runtime(run_id)
    meta = CheckpointMeta(step=step, policy_version=runtime.policy_version, config_hash=runtime.config.config_hash())
    with tempfile.TemporaryDirectory() as folder:
        save_checkpoint(Path(folder), runtime.policy, runtime.tokenizer, runtime.trainer.state_dict(), meta)
        runtime.lake.save_checkpoint(run_id, step, Path(folder))


def _load_newest_intact_checkpoint(runtime: Runtime, run_id: str, step: int) -> tuple[int, CheckpointMeta, dict]:
    """Load checkpoint `step` into the policy, or, if it is corrupted (a file altered, missing,
    or a trainer pickle that would run code), the newest intact one before it (more committed
    steps are then replayed). LakeCorrupted when none is intact."""
    while True:
        try:
            with tempfile.TemporaryDirectory() as folder:
                runtime.lake.load_checkpoint(run_id, step, Path(folder))
                meta, trainer_state = load_checkpoint(Path(folder), runtime.policy, _checkpoint_uri(runtime, run_id, step))
            return step, meta, trainer_state
        except LakeCorrupted as exc:
            older = runtime.lake.latest_checkpoint(run_id, at_or_before=step - 1) if step > 0 else None
            if older is None:
                raise
            get_run_logger().warning("checkpoint %d of run %s is corrupted (%s); falling back to checkpoint %d",
                                     step, run_id, exc.message, older)
            step = older


def _checkpoint_uri(runtime: Runtime, run_id: str, step: int) -> str:
    return f"{runtime.lake.uri.rstrip('/')}/checkpoints/{run_id}/step={step:06d}"


def _refuse_old_schema(runtime: Runtime, run_id: str, step: int) -> None:
    """ConfigError when committed step `step` holds rows of an older trajectory schema: their
    logprobs follow another convention, so replaying or continuing the run would be wrong."""
    manifest = runtime.lake.read_manifest(run_id, step)
    versions = runtime.lake.read_parts_table(manifest.parts if manifest else ()).column("schema_version").to_pylist()
    oldest = min(versions, default=SCHEMA_VERSION)
    if oldest < SCHEMA_VERSION:
        raise ConfigError(
            f"run {run_id!r} holds trajectories of schema version {oldest} (step {step}); this rlpipe writes and trains on version {SCHEMA_VERSION}",
            f"start a new run (a new --run-id); runs from before version {SCHEMA_VERSION} stored temperature-1 logprobs, "
            "which the trainer no longer matches",
        )


@task(name="restore", **STAGE_OPTIONS)
def restore(run_id: str) -> int:
    """Bring the policy to the last committed step: load the newest checkpoint at or
    before it, replay the updates of the committed steps after it from the stored rows.
    Returns the last committed step (0 when no RL step is committed yet)."""
    runtime = get_runtime(run_id)
    committed = runtime.lake.committed_steps(run_id)
    if committed:
        _refuse_old_schema(runtime, run_id, committed[0])
    last = max(committed, default=0)
    step = runtime.lake.latest_checkpoint(run_id, at_or_before=last)
    if step is None:
        return -1  # not even the warm-start finished: start over from the warm-start
    step, meta, trainer_state = _load_newest_intact_checkpoint(runtime, run_id, step)
    runtime.trainer.load_state_dict(trainer_state)
    runtime.policy_version = meta.policy_version
    if runtime.trainer.reference_model is not None:  # the KL anchor: the warm-started policy
        with tempfile.TemporaryDirectory() as folder:
            runtime.lake.load_checkpoint(run_id, 0, Path(folder))
            load_policy_weights(Path(folder), runtime.trainer.reference_model)
    for replayed in range(step + 1, last + 1):
        train_metrics = apply_committed_update(runtime, replayed)
        log_step(runtime, replayed, train_metrics)
    runtime.engine.load_weights(runtime.trainer.named_weights(), runtime.policy_version)
    return last


@task(name="finish", **STAGE_OPTIONS)
def finish(run_id: str, before: float, after: float) -> dict[str, object]:
    """Reward curve and end of the MLflow run, the Prefect summary; returns the summary."""
    runtime = get_runtime(run_id)
    tracker, lake = runtime.tracker, runtime.lake
    steps_committed = len(lake.committed_steps(run_id))
    final_step = lake.latest_checkpoint(run_id)
    tracker.log_reward_curve(runtime.mlflow_run_id, lake, run_id)
    tracker.log_step_metrics(
        runtime.mlflow_run_id, runtime.policy_version, {"heldout/accuracy_gain": after - before}, timestamp_ms=None
    )
    tracker.end_run(runtime.mlflow_run_id, "FINISHED")
    url = tracker.run_url(runtime.mlflow_run_id)
    mlflow_line = (
        f"MLflow run: [{runtime.mlflow_run_id}]({url})" if url
        else f"MLflow run `{runtime.mlflow_run_id}` in `{tracker.uri}` (view: `mlflow ui --backend-store-uri {tracker.uri}`)"
    )
    checkpoint = f"{_checkpoint_uri(runtime, run_id, final_step)}/{POLICY_DIR}"  # the HF model folder
    create_markdown_artifact(
        key=f"rlpipe-summary-{artifact_key(run_id)}",
        markdown=(
            f"# RL run `{run_id}`\n\n| held-out accuracy (greedy pass@1) | value |\n|---|---|\n"
            f"| before RL | {before:.3f} |\n| after RL | {after:.3f} |\n| change | {after - before:+.3f} |\n\n"
            f"Steps committed: {steps_committed}. Lake: `{lake.uri}`. Final policy (HF folder): `{checkpoint}`.\n\n"
            f"{mlflow_line}\n"
        ),
        description=f"Summary of run {run_id}",
    )
    return dict(
        run_id=run_id, lake_uri=lake.uri, tracking_uri=tracker.uri, mlflow_run_id=runtime.mlflow_run_id,
        mlflow_run_url=url, steps_committed=steps_committed, accuracy_before_rl=before,
        accuracy_after_rl=after, final_checkpoint=checkpoint,
    )

