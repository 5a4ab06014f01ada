"""The `train` flow: one flow run per RL run; every step is one task run of it (two when pipelined).

    train:  open-run -> [restore] -> [warm-start -> checkpoint(0)] -> evaluate(before_rl)
            -> rl-step(s) ... -> evaluate(after_rl) -> checkpoint(final) -> finish
    rl-step: step (sample -> generate -> verify -> advantages -> persist
                   -> update -> sync -> track) [-> checkpoint every N steps]
             (flows/steps.py; pipelined when rollout.max_staleness > 0: a rollout task and
             a train task per step, in two threads)

An rl-step is a plain function, not a nested flow: its task is a task run of the run's
flow run, named by step (`step-4`; `rollout-step-4` and `train-step-4` when pipelined). A nested flow run per step, and
then a task run per stage, cost more than a small step's work (benchmarks/step_breakdown.py),
and added nothing the lake does not already know: which steps are done is the lake's
manifests, what a stage computed is staged in the lake.

The flow-run process is the controller: the model, the optimizer and the engine live in the
run's two worker processes (an engine worker and a trainer worker), started with the run's
Runtime (controller/launch.py `build_runtime`), which the flow hands to every task by
reference, and stopped in `finally`, so a failed or interrupted run leaves no worker behind.

The lake decides what is done: a run that already exists is restored (checkpoint + replay
of committed steps) instead of started, and only uncommitted steps run. Every stage is a
task that passes references (run id, step, URIs, policy version), never models or rows;
the flow bodies themselves do no I/O but the best-effort status lines (orchestration/status.py)
and, for runs of a deployment, Prefect's own API: a trainer slot (flows/operations.py) and,
in a retry, ending the dead attempt's open task runs (flows/stale_task_runs.py).
Flows import tasks/, orchestration/ (the status lines), core/ and, for the run's state,
controller/ (an import-linter contract keeps storage, engine, RL, env and sandbox code out).

Parameters are typed (flows/run_parameters.py): `config` is a RunConfig, so the Prefect UI
draws a form with every table's defaults and docs, and `prefect deployment run --param`
or `--params '{"config": {"train": {"steps": 5}}}'` work; `config_path` names a TOML file on
the worker, under the form's changes (the rule of `--set`); an empty `run_id` gets a new id per flow run (a nightly schedule starts a new
run each night). `rlpipe train` calls this same flow with a RunConfig and its run id.
No `from __future__ import annotations` here: a served flow is pickled into its flow-run
subprocess, where Prefect validates the parameters against the annotations; as strings,
`RunConfig` was not resolvable there (pydantic: "TrainModel is not fully defined").
"""

import logging
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from prefect import flow
from prefect.concurrency.sync import concurrency
from prefect.context import FlowRunContext
from prefect.runtime import flow_run

from rlpipe.controller.launch import build_runtime
from rlpipe.core.config import RunConfig
from rlpipe.flows.crash_retry import DEFAULT_CRASH_RETRIES, retry_crashed_run
from rlpipe.flows.operations import TRAINER_LEASE_S, TRAINER_LIMIT
from rlpipe.flows.run_parameters import derive_run_id, resolve_config
from rlpipe.flows.stale_task_runs import crash_stale_task_runs
from rlpipe.flows.steps import StepsOutcome, run_steps
from rlpipe.orchestration import status
from rlpipe.tasks import lifecycle, quality_gate

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


def _flow_run_name() -> str:
    """The run id, also when the flow run derives it (so the UI lists runs by run id)."""
    return _run_id(flow_run.get_parameters().get("run_id") or "", flow_run.get_parameters().get("config_path"))


def _run_id(run_id: str, config_path: str | None) -> str:
    if run_id:
        return run_id
    return derive_run_id(flow_run.get_id(), flow_run.get_scheduled_start_time(), config_path)


@flow(name="rl-train", flow_run_name=_flow_run_name, on_crashed=[retry_crashed_run])
def train(config: RunConfig = RunConfig(), run_id: str = "", config_path: str | None = None,
          crash_retries: int = DEFAULT_CRASH_RETRIES) -> TrainSummary:
    """Train a policy with GRPO; resume from the lake if the run already exists.

    Args:
        config: The run config (every table with its defaults). With config_path, the values
            changed here from the defaults go on top of the file's, as `--set` does on the
            command line: the form's values win.
        run_id: The run's id. Empty: a new id per flow run ({file stem or "run"}-{date}-{flow run
            id}); a retry of the same flow run resumes it. An id that exists in the lake resumes
            that run (its config must compute the same: see `rlpipe resume`).
        config_path: A sparse TOML config file, read where the flow run runs (the worker).
        crash_retries: How many times a deployment's run whose process died (kill -9, out of
            memory) is rescheduled to resume by itself (flows/crash_retry.py); 0: never.
    """
    crash_stale_task_runs()  # a retry after a kill: the dead attempt's task runs end Crashed, not Running forever
    config = resolve_config(config, config_path)  # flows/run_parameters.py: the rule for both
    run_id = _run_id(run_id, config_path)
    with _trainer_slot():  # a deployment's run waits here for a trainer (flows/operations.py)
        return _train(config, run_id)


def _trainer_slot() -> AbstractContextManager[object]:
    """One slot of the global concurrency limit `rlpipe-trainer` for a deployment's run, held
    while its trainer lives; nothing for `rlpipe train` (one run, one command). Where the
    limit is not declared, Prefect logs a warning and the run goes on. A run killed with -9
    keeps its slot until the lease runs out (TRAINER_LEASE_S, renewed while alive)."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None or context.flow_run.deployment_id is None:
        return nullcontext()
    return concurrency(TRAINER_LIMIT, occupy=1, strict=False, lease_duration=TRAINER_LEASE_S)


def _train(config: RunConfig, run_id: str) -> TrainSummary:
    # The controller's state of the run, handed to every task by reference (controller/runtime.py).
    runtime = build_runtime(run_id, config)  # spawns the workers; raises on bad input before anything is written
    outcome, stage = StepsOutcome(), "open-run"  # what status.json names if the run fails here
    try:
        # 1. A new run, or the state of an existing one rebuilt from the lake.
        resumed = lifecycle.open_run(runtime)
        links = status.record_links(runtime)  # the CLI prints them as soon as they are in the lake
        if config.qa.before_train:  # the environment quality gate, before the warm start (tasks/quality_gate.py)
            stage = "quality-gate"
            quality_gate.quality_gate(runtime)
        stage = "restore"
        last_committed = lifecycle.restore(runtime) if resumed else -1
        # 2. A new run (or one killed before its first checkpoint) warm-starts.
        if last_committed < 0:
            stage = "warm-start"
            status.set_running(runtime, 0, stage)
            lifecycle.warm_start(runtime)
            lifecycle.checkpoint(runtime, 0)
            last_committed = 0
        stage = "evaluate"
        before = lifecycle.evaluate(runtime, "before_rl")
        # 3. The RL steps not trained yet (each writes its own failed status; flows/steps.py).
        stage = "rl-step"
        run_steps(runtime, last_committed + 1, outcome)
        # 4. Held-out accuracy after RL, the final checkpoint (HF layout), the summary.
        stage = "evaluate"
        after = lifecycle.evaluate(runtime, "after_rl")
        stage = "checkpoint"
        lifecycle.checkpoint(runtime, config.train.steps)
        stage = "finish"
        summary = lifecycle.finish(runtime, before["accuracy"], after["accuracy"])
        status.set_finished(runtime, config.train.steps)
        return TrainSummary(
            **summary, prefect_flow_run_id=str(links["prefect_flow_run_id"]), prefect_flow_run_url=links["prefect_flow_run_url"]
        )
    except BaseException as exc:
        if outcome.failed_step is None:  # a step records its own failure
            status.set_failed(runtime, runtime.progress.policy_version, stage, exc)
        if status.interruption(exc):
            status.release_interrupted_frames(exc)
        if runtime.records.mlflow_run_id:
            try:
                runtime.records.tracker.end_run(runtime.records.mlflow_run_id, "KILLED" if status.interruption(exc) else "FAILED")
            except Exception as tracking_error:  # noqa: BLE001 - the run's own error matters more
                log.warning("could not mark MLflow run %s failed: %s", runtime.records.mlflow_run_id, tracking_error)
        raise
    finally:
        runtime.close()

