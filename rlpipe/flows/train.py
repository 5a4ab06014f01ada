"""The `train` flow: one flow run per RL run; every stage of every step is a task of it.

    train:  open-run -> [restore] -> [warm-start -> checkpoint(0)] -> evaluate(before_rl)
            -> rl-step(s) ... -> evaluate(after_rl) -> checkpoint(final) -> finish
    rl-step: sample -> generate -> verify -> advantages -> persist -> update -> sync -> track
             [-> checkpoint every N steps]

An rl-step is a plain function, not a nested flow: its stages are task runs of the run's flow
run, named by step (`generate-step-4`). A nested flow run per step cost more than the
step's stages on small steps (benchmarks/step_breakdown.py), and added nothing the lake
does not already know: which steps are done is the lake's manifests, what a stage returned
is its cache.

The flow-run process is the controller: the model, the optimizer and the engine live in the
run's two worker processes (an engine worker and a trainer worker), started with the run's
runtime and stopped in `finally`, so a failed or interrupted run leaves no worker behind.

The lake decides what is done: a run that already exists is restored (checkpoint + replay
of committed steps) instead of started, and only uncommitted steps run. Every stage is a
task that passes references (run id, step, URIs, policy version), never models or rows;
the flow bodies themselves do no I/O but the best-effort status lines (tasks/status.py).
Flows import only tasks/ and core/ (an import-linter contract).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from prefect import flow

from rlpipe.tasks import quality_gate
from rlpipe.core.config import RunConfig
from rlpipe.core.errors import StagedRowsMissing
from rlpipe.tasks import advantage, lifecycle, persist, rollout, status, track, update, verify
from rlpipe.tasks.runtime import build_runtime, get_runtime, release_runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainSummary:
    run_id: str
    lake_uri: str
    tracking_uri: str
    mlflow_run_id: str
    mlflow_run_url: str | None
    prefect_flow_run_id: str
    prefect_flow_run_url: str | None
    steps_committed: int
    accuracy_before_rl: float
    accuracy_after_rl: float
    final_checkpoint: str


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


def rl_step(run_id: str, step: int) -> None:
    """One RL step, top to bottom. The train flow calls it only for uncommitted steps."""
    runtime = get_runtime(run_id)
    clock = _StageClock()
    try:
        # 1. The step's tasks: a function of (run seed, step).
        clock.enter("sample")
        task_ids = rollout.sample(run_id, step)
        # 2-5. Sample, verify, score, commit. A cached stage may point at staged rows that
        #      are gone (cleaned, or a lake that lost them): then run the stages again uncached.
        try:
            _stage_and_commit(run_id, step, task_ids, clock, refresh_cache=False)
        except StagedRowsMissing as exc:
            log.warning("step %d of run %s: %s; rerunning its stages without the cache", step, run_id, exc.message)
            _stage_and_commit(run_id, step, task_ids, clock, refresh_cache=True)
        # 6. The policy update on the committed rows (mini_batches_per_step x epochs_per_step
        #    optimizer steps).
        clock.enter("update")
        train_metrics = update.update(run_id, step)
        # 7. New weights into the engine worker (the trainer worker publishes them on /dev/shm).
        clock.enter("sync")
        sync_metrics = update.sync(run_id, step)
        # 8. Metrics to MLflow and the Prefect UI.
        clock.enter("track")
        timings = {f"time/{name}_s": seconds for name, seconds in clock.seconds.items() if name != "start"}
        timings["time/step_s"] = sum(timings.values())
        track.track(run_id, step, {**train_metrics, **sync_metrics, **timings})
        # 9. Checkpoint every N steps.
        if step % runtime.config.checkpoint.every_steps == 0:
            clock.enter("checkpoint")
            lifecycle.checkpoint(run_id, step)
    except BaseException as exc:
        status.set_failed(run_id, step, clock.stage, exc)
        raise


def _stage_and_commit(run_id: str, step: int, task_ids: tuple[str, ...], clock: _StageClock, refresh_cache: bool) -> None:
    """Stages 2-5 of a step; `refresh_cache` recomputes the cached ones (same seeds, same rows)."""
    stage = (lambda task_: task_.with_options(refresh_cache=True)) if refresh_cache else (lambda task_: task_)
    # 2. Sample group_size completions per task with the current policy.
    clock.enter("generate")
    generated_uri = stage(rollout.generate)(run_id, step, task_ids)
    # 3. Verify every completion (fanned out inside the task).
    clock.enter("verify")
    verified_uri = stage(verify.verify)(run_id, step, generated_uri)
    # 4. Group-normalised advantages.
    clock.enter("advantages")
    scored_uri = stage(advantage.advantages)(run_id, step, verified_uri)
    # 5. Commit the step: Parquet part, then the manifest.
    clock.enter("persist")
    persist.persist(run_id, step, scored_uri)


@flow(name="rl-train", flow_run_name="{run_id}")
def train(config_json: str, run_id: str) -> TrainSummary:
    """Train a policy with GRPO; resume from the lake if the run already exists."""
    config = RunConfig.model_validate_json(config_json)
    runtime = build_runtime(run_id, config)  # spawns the workers; raises on bad input before anything is written
    failing_step, stage = None, "open-run"  # what status.json names if the run fails here
    try:
        # 1. A new run, or the state of an existing one rebuilt from the lake.
        resumed = lifecycle.open_run(run_id)
        links = status.record_links(run_id)  # the CLI prints them as soon as they are in the lake
        if config.qa.before_train:  # the environment quality gate, before the warm start (tasks/quality_gate.py)
            quality_gate.quality_gate(run_id)
        stage = "restore"
        last_committed = lifecycle.restore(run_id) if resumed else -1
        # 2. A new run (or one killed before its first checkpoint) warm-starts.
        if last_committed < 0:
            stage = "warm-start"
            status.set_running(run_id, 0, stage)
            lifecycle.warm_start(run_id)
            lifecycle.checkpoint(run_id, 0)
            last_committed = 0
        stage = "evaluate"
        before = lifecycle.evaluate(run_id, "before_rl")
        # 3. The RL steps not committed yet (rl-step writes its own failed status).
        for step in range(last_committed + 1, config.train.steps + 1):
            status.set_running(run_id, step, "rl-step")
            failing_step = step
            rl_step(run_id, step)
            failing_step = None
            if config.eval.every_steps and step % config.eval.every_steps == 0 and step != config.train.steps:
                lifecycle.evaluate(run_id, f"step_{step:06d}")
        # 4. Held-out accuracy after RL, the final checkpoint (HF layout), the summary.
        stage = "evaluate"
        after = lifecycle.evaluate(run_id, "after_rl")
        stage = "checkpoint"
        lifecycle.checkpoint(run_id, config.train.steps)
        stage = "finish"
        summary = lifecycle.finish(run_id, before["accuracy"], after["accuracy"])
        status.set_finished(run_id, config.train.steps)
        return TrainSummary(
            **summary, prefect_flow_run_id=str(links["prefect_flow_run_id"]), prefect_flow_run_url=links["prefect_flow_run_url"]
        )
    except BaseException as exc:
        if failing_step is None:
            status.set_failed(run_id, runtime.policy_version, stage, exc)
        else:  # rl-step wrote its stage, unless the error came before its body ran
            status.set_failed_unless_recorded(run_id, failing_step, "rl-step", exc)
        if status.interruption(exc):
            status.release_interrupted_frames(exc)
        if runtime.mlflow_run_id:
            try:
                runtime.tracker.end_run(runtime.mlflow_run_id, "KILLED" if status.interruption(exc) else "FAILED")
            except Exception as tracking_error:  # noqa: BLE001 - the run's own error matters more
                log.warning("could not mark MLflow run %s failed: %s", runtime.mlflow_run_id, tracking_error)
        raise
    finally:
        release_runtime(run_id)

