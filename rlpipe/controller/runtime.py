"""The controller's state of one run: `Runtime`, an object the train flow builds
(controller/launch.py), hands to every task of the run by reference, and closes in `finally`.

The flow-run process is the controller: it holds the config, the mixture (tasks are
cheap), the held-out tasks, and three parts, one per concern, each a typed record held by
the Runtime and changed in place:

    runtime.workers   Workers      handles to the engine worker, the trainer worker (rlpipe/workers/)
                                   and the sandbox pool, and the folders of their sockets and weights
    runtime.records   RunRecords   where the run is recorded: the lake, the tracker (MLflow), the
                                   run's MLflow id and incarnation, the Prefect table's rows, and the
                                   hold on the run (one writer at a time, storage/run_lock.py)
    runtime.progress  RunProgress  where the run is in its schedule: which policy version the trainer
                                   and the engine hold, the published weights files, the last updates'
                                   metrics, the curriculum, whether the warm start began

No model, optimizer or engine lives here. A task receives the Runtime as a parameter:
stage tasks have no Prefect cache and persist no result (orchestration/stage_options.py), so
Prefect neither hashes nor serializes their inputs, and a task retry runs in the same
process, on the same object. A retry of the whole flow run (the UI's, a crash retry,
`rlpipe resume`) runs the flow again, which builds a new Runtime. So there is no registry
of runtimes: a Runtime lives exactly as long as the flow call that built it.

`Runtime` is a plain class on purpose, not a dataclass: Prefect walks a dataclass (or
pydantic) task parameter field by field, looking for futures, on every task call; it does
not look inside a plain object, so the parts can be dataclasses.

Not here: building it and spawning the workers (controller/launch.py), any RL logic (rl/),
worker internals (workers/), orchestration (flows/).
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from rlpipe.core.config import RunConfig
from rlpipe.core.records import Task
from rlpipe.envs.mixture import Mixture
from rlpipe.rl.curriculum import Curriculum
from rlpipe.storage.lake import Lake
from rlpipe.storage.run_lock import RunHold
from rlpipe.storage.tracking import Tracker
from rlpipe.workers.client import EngineClient, TrainerClient


@dataclass(eq=False)
class Workers:
    """The run's worker processes and sandbox pool, and the folders they share with it."""

    engine: EngineClient
    trainer: TrainerClient
    socket_folder: Path  # the workers' RPC sockets
    weights_folder: Path  # on /dev/shm: the weights files the trainer publishes and the engine loads
    sandbox_pool: object | None = None  # a SandboxPool or RaySandboxPool when some domain runs code

    def close(self) -> None:
        """Stop both workers and the sandbox pool; remove the sockets' and weights' folders."""
        try:
            for worker in (self.engine, self.trainer):
                worker.close()
        finally:
            shutil.rmtree(self.socket_folder, ignore_errors=True)
            shutil.rmtree(self.weights_folder, ignore_errors=True)
            if self.sandbox_pool is not None:
                self.sandbox_pool.close()


@dataclass(eq=False)
class RunRecords:
    """Where the run is recorded."""

    lake: Lake
    tracker: Tracker
    mlflow_run_id: str = ""  # set by open-run
    incarnation: str = ""  # run.json's created_at: tells a run apart from an earlier one of the same id
    step_metrics: list[dict[str, float]] = field(default_factory=list)  # rows of the Prefect table (orchestration/track.py)
    table_refreshed_at: float | None = None  # time.monotonic() of the table's last refresh by this process
    hold: RunHold | None = None  # this process writes the run; released once the workers stopped


@dataclass(eq=False)
class RunProgress:
    """Where the run is in its schedule, as the controller knows it."""

    policy_version: int = 0  # the trainer's acknowledged version
    engine_version: int | None = None  # the engine's; None: not synced yet
    engine_wanted: int | None = None  # the version the last generate asked for
    published: dict[int, str] = field(default_factory=dict)  # version -> weights file kept for the async rollout lane
    published_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # the lane and the flow share `published`
    trainer_in_lake: bool = False  # a checkpoint holds the trainer's state: a fresh trainer can restore it
    warm_start_begun: bool = False
    update_metrics: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> its update's metrics (a retried `train`)
    curriculum: Curriculum | None = None  # built by the first `step_ratios` (controller/sample.py); memoises its state


class Runtime:
    """What the controller holds for one RL run. One per flow call; passed by reference.

    `run_id`, `config`, `mixture` and `heldout` (what the steps draw from) never change;
    `workers`, `records` and `progress` are the parts above, changed in place.
    """

    def __init__(self, run_id: str, config: RunConfig, mixture: Mixture, heldout: list[Task], workers: Workers,
                 records: RunRecords) -> None:
        self.run_id = run_id
        self.config = config
        self.mixture = mixture
        self.heldout = heldout
        self.workers = workers
        self.records = records
        self.progress = RunProgress()

    def __repr__(self) -> str:  # Prefect may name a parameter in a log line
        return f"Runtime(run_id={self.run_id!r}, policy_version={self.progress.policy_version})"

    def close(self) -> None:
        """Stop the workers and the sandbox pool (Workers.close), then let another process
        take the run (the trainer worker writes checkpoints into the lake until it stops)."""
        try:
            self.workers.close()
        finally:
            if self.records.hold is not None:
                self.records.hold.release()
