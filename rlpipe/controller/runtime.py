"""The controller's state of one run: `Runtime`, an object the train flow builds
(controller/launch.py), hands to every task of the run by reference, and closes in `finally`.

The flow-run process is the controller: it holds the config, the lake, the tracker, the
mixture (tasks are cheap), the held-out tasks, the sandbox pool and handles to the run's
engine worker and trainer worker (rlpipe/workers/). No model, optimizer or engine lives
here. A task receives the Runtime as a parameter: stage tasks have no Prefect cache and
persist no result (tasks/stage_options.py), so Prefect neither hashes nor serializes their
inputs, and a task retry runs in the same process, on the same object. A retry of the whole
flow run (the UI's, a crash retry, `rlpipe resume`) runs the flow again, which builds a new
Runtime. So there is no registry of runtimes: a Runtime lives exactly as long as the flow
call that built it.

`Runtime` is a plain class on purpose, not a dataclass: Prefect walks a dataclass (or
pydantic) task parameter field by field, looking for futures, on every task call.

Not here: building it and spawning the workers (controller/launch.py), any RL logic (rl/),
worker internals (workers/), orchestration (flows/).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rlpipe.core.config import RunConfig
from rlpipe.core.records import Task
from rlpipe.envs.mixture import Mixture
from rlpipe.rl.curriculum import Curriculum
from rlpipe.storage.lake import Lake
from rlpipe.storage.tracking import Tracker
from rlpipe.workers.client import EngineClient, TrainerClient


class Runtime:
    """What the controller holds for one RL run. One per flow call; passed by reference.

    Three concerns, in three groups of attributes:
    - the run and its records: `run_id`, `config`, `lake`, `tracker`, `mlflow_run_id`,
      `incarnation` (run.json's created_at: tells a run apart from an earlier one of the same id),
      `step_metrics` (the rows of the Prefect table of step metrics, tasks/track.py);
    - what the steps draw from: `mixture`, `heldout`, `curriculum` (built by the first
      `step_ratios`, controller/sample.py; it memoises its state);
    - the workers and where their weights are: `engine`, `trainer`, `sandbox_pool`, the
      folders of their sockets and of the weights on /dev/shm, `policy_version` (the
      trainer's acknowledged version), `engine_version` (the engine's; None: not synced yet),
      `engine_wanted` (the version the last generate asked for), `published` (version ->
      weights file kept for the async rollout lane), `trainer_in_lake` (a checkpoint holds
      the trainer's state: a fresh trainer can restore it), `warm_start_begun`,
      `update_metrics` (step -> the last update's metrics, for a retried `train` task).
    """

    def __init__(self, run_id: str, config: RunConfig, lake: Lake, tracker: Tracker, mixture: Mixture,
                 heldout: list[Task], engine: EngineClient, trainer: TrainerClient, socket_folder: Path,
                 weights_folder: Path) -> None:
        # the run and its records
        self.run_id = run_id
        self.config = config
        self.lake = lake
        self.tracker = tracker
        self.mlflow_run_id = ""
        self.incarnation = ""
        self.step_metrics: list[dict[str, float]] = []
        # what the steps draw from
        self.mixture = mixture
        self.heldout = heldout
        self.curriculum: Curriculum | None = None
        # the workers and their weights
        self.engine = engine
        self.trainer = trainer
        self.sandbox_pool: object | None = None
        self.socket_folder = socket_folder
        self.weights_folder = weights_folder
        self.policy_version = 0
        self.engine_version: int | None = None
        self.engine_wanted: int | None = None
        self.published: dict[int, str] = {}
        self.trainer_in_lake = False
        self.warm_start_begun = False
        self.update_metrics: dict[int, dict[str, float]] = {}

    def __repr__(self) -> str:  # Prefect may name a parameter in a log line
        return f"Runtime(run_id={self.run_id!r}, policy_version={self.policy_version})"

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
