"""The `train` flow: one flow run per RL run, one nested flow run per RL step.

    train:  open-run -> [warm-start -> evaluate(before_rl) -> checkpoint(0)] or restore
            -> rl-step(s) ... -> evaluate(after_rl) -> checkpoint(final) -> summary
    rl-step: sample -> generate -> verify -> advantages -> persist -> update -> sync -> track

The lake decides what is done: a step whose manifest exists is not run again, and a run
that already exists is restored (checkpoint + replay) instead of started. Every stage is a
task that passes references (run id, step, URIs, policy version), never models or rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from rlpipe.core.config import RunConfig
from rlpipe.storage.lake_records import RunState, RunStatus
from rlpipe.tasks import advantage, lifecycle, persist, rollout, track, update, verify
from rlpipe.tasks.runtime import build_runtime, get_runtime, release_runtime


@dataclass(frozen=True)
class TrainSummary:
    run_id: str
    lake_uri: str
    tracking_uri: str
    mlflow_run_id: str
    steps_committed: int
    accuracy_before_rl: float
    accuracy_after_rl: float


class _StageClock:
    """Times the stages of one step and remembers which stage is running."""

    def __init__(self) -> None:
        self.stage = "start"
        self.seconds: dict[str, float] = {}
        self._started = time.perf_counter()

    def enter(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[self.stage] = self.seconds.get(self.stage, 0.0) + now - self._started
        self.stage, self._started = stage, now


@flow(name="rl-step", flow_run_name="{run_id}-step-{step}")
def rl_step(run_id: str, step: int) -> None:
    """One RL step, top to bottom."""
    runtime = get_runtime(run_id)
    clock = _StageClock()
    try:
        # 1. Skip the rollout stages of a committed step: the lake is the truth.
        if runtime.lake.read_manifest(run_id, step) is None:
            clock.enter("sample")
            task_ids = rollout.sample(run_id, step)
            # 2. Sample group_size completions per task with the current policy.
            clock.enter("generate")
            generated_uri = rollout.generate(run_id, step, task_ids)
            # 3. Verify every completion (fanned out inside the task).
            clock.enter("verify")
            verified_uri = verify.verify(run_id, step, generated_uri)
            # 4. Group-normalised advantages.
            clock.enter("advantages")
            scored_uri = advantage.advantages(run_id, step, verified_uri)
            # 5. Commit the step: Parquet part, then the manifest.
            clock.enter("persist")
            persist.persist(run_id, step, scored_uri)
        # 6. One optimizer step on the committed rows.
        clock.enter("update")
        train_metrics = update.update(run_id, step)
        # 7. New weights into the rollout engine.
        clock.enter("sync")
        update.sync(run_id, step)
        # 8. Metrics to MLflow and the Prefect UI.
        clock.enter("track")
        timings = {f"time/{name}_s": seconds for name, seconds in clock.seconds.items() if name != "start"}
        timings["time/step_s"] = sum(timings.values())
        tokens = train_metrics.get("train/tokens", 0.0)
        if timings.get("time/generate_s"):
            timings["throughput/tokens_per_s"] = tokens / timings["time/generate_s"]
        track.track(run_id, step, {**train_metrics, **timings})
        # 9. Checkpoint every N steps.
        if step % runtime.config.checkpoint.every_steps == 0:
            clock.enter("checkpoint")
            lifecycle.checkpoint(run_id, step)
    except BaseException as exc:
        _set_status(run_id, RunState.FAILED, step, clock.stage, exc)
        raise


@flow(name="rl-train", flow_run_name="{run_id}")
def train(config_json: str, run_id: str) -> TrainSummary:
    """Train a policy with GRPO; resume from the lake if the run already exists."""
    config = RunConfig.model_validate_json(config_json)
    runtime = build_runtime(run_id, config)  # raises on bad input before anything is written
    try:
        resumed = lifecycle.open_run(run_id)
        last_committed = lifecycle.restore(run_id) if resumed else -1
        if last_committed < 0:
            _set_status(run_id, RunState.RUNNING, 0, "warm-start")
            lifecycle.warm_start(run_id)
            lifecycle.checkpoint(run_id, 0)
            last_committed = 0
        before = lifecycle.evaluate(run_id, "before_rl") if last_committed == 0 else _stored_eval(run_id)
        for step in range(last_committed + 1, config.train.steps + 1):
            _set_status(run_id, RunState.RUNNING, step, "rl-step")
            rl_step(run_id, step)
            if config.eval.every_steps and step % config.eval.every_steps == 0 and step != config.train.steps:
                lifecycle.evaluate(run_id, f"step_{step:06d}")
        after = lifecycle.evaluate(run_id, "after_rl")
        if runtime.lake.latest_checkpoint(run_id, at_or_before=None) != config.train.steps:
            lifecycle.checkpoint(run_id, config.train.steps)
        summary = _summarize(run_id, before["accuracy"], after["accuracy"])
        _set_status(run_id, RunState.FINISHED, config.train.steps, "done")
        return summary
    except BaseException as exc:
        status = runtime.lake.read_status(run_id)
        if status is None or status.state != RunState.FAILED:
            _set_status(run_id, RunState.FAILED, runtime.policy_version, "train", exc)
        raise
    finally:
        release_runtime(run_id)


def _set_status(run_id: str, state: RunState, step: int, stage: str, error: BaseException | None = None) -> None:
    message = None if error is None else f"{type(error).__name__}: {error}"[:2000]
    status = RunStatus(run_id, state, step, stage, message, int(time.time() * 1000))
    try:
        get_runtime(run_id).lake.write_status(status)
    except Exception:  # noqa: BLE001 - the lake may be what failed; the original error matters more
        if error is None:
            raise


def _stored_eval(run_id: str) -> dict[str, float]:
    runtime = get_runtime(run_id)
    stored = runtime.lake.read_json(run_id, "evals/before_rl.json") or {"accuracy": float("nan")}
    return stored


def _summarize(run_id: str, before: float, after: float) -> TrainSummary:
    runtime = get_runtime(run_id)
    summary = TrainSummary(
        run_id=run_id,
        lake_uri=runtime.lake.uri,
        tracking_uri=runtime.tracker.uri,
        mlflow_run_id=runtime.mlflow_run_id,
        steps_committed=len(runtime.lake.committed_steps(run_id)),
        accuracy_before_rl=before,
        accuracy_after_rl=after,
    )
    runtime.tracker.log_reward_curve(runtime.mlflow_run_id, runtime.lake, run_id)
    runtime.tracker.end_run(runtime.mlflow_run_id, "FINISHED")
    link = runtime.tracker.run_url(runtime.mlflow_run_id)
    create_markdown_artifact(
        key=f"rlpipe-summary-{run_id.lower()}",
        markdown=(
            f"# RL run `{run_id}`\n\n"
            f"| held-out accuracy | value |\n|---|---|\n"
            f"| before RL | {before:.3f} |\n| after RL | {after:.3f} |\n| change | {after - before:+.3f} |\n\n"
            f"Steps committed: {summary.steps_committed}. Lake: `{runtime.lake.uri}`.\n\n"
            + (f"MLflow run: [{runtime.mlflow_run_id}]({link})\n" if link else
               f"MLflow run `{runtime.mlflow_run_id}` in `{runtime.tracker.uri}` (`mlflow ui --backend-store-uri {runtime.tracker.uri}`)\n")
        ),
        description=f"Summary of run {run_id}",
    )
    return summary
