"""Start and stop the controller's side of a run: `build_runtime` spawns both workers (they
build their models while the controller opens the run) and returns the run's Runtime;
`Runtime.close` stops them (the train flow calls it in `finally`, so a failed or interrupted
run leaves no worker behind).

A worker that died is restarted by the next call to it (workers/client.py); the hooks set
here bring the fresh one back to the run's state: a trainer restores the last good state
from the lake (checkpoint + replay up to the controller's policy version), an engine gets
the weights the rollouts need (controller/weight_sync.py).

Not here: what the Runtime holds (controller/runtime.py), the checks a run's input passes
first (controller/preflight.py), the RL steps (flows/, tasks/).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from rlpipe.controller.builders import build_lake, build_tracker
from rlpipe.controller.evaluation import heldout_tasks
from rlpipe.controller.preflight import check_engine_options, engine_python
from rlpipe.controller.runtime import RunRecords, Runtime, Workers
from rlpipe.controller.sample import build_mixture
from rlpipe.controller.weight_sync import restore_engine_version
from rlpipe.core.config import RunConfig
from rlpipe.envs.mixture import Mixture
from rlpipe.storage.lake import Lake
from rlpipe.storage.run_lock import RunHold, hold_run
from rlpipe.storage.tracking import Tracker
from rlpipe.workers.client import EngineClient, TrainerClient, WorkerSpec
from rlpipe.workers.shm import create_weights_folder


def build_runtime(run_id: str, config: RunConfig) -> Runtime:
    """Build the controller's parts, take the run (one writer at a time: RunInUse if another
    process writes it) and spawn both workers (not waiting for them). Fails on bad input
    (unreachable lake, unknown domain) before anything is written anywhere but the run's lock
    file; a failure here stops whatever was started. The caller closes the Runtime."""
    check_engine_options(config)  # a deployment's run skips the CLI's preflight
    lake = build_lake(config)
    mixture = build_mixture(config)
    tracker = build_tracker(config)
    hold = hold_run(lake.location, run_id)  # before any worker: a refused second writer starts nothing
    try:
        return _spawn(run_id, config, lake, mixture, tracker, hold)
    except BaseException:
        hold.release()
        raise


def _spawn(run_id: str, config: RunConfig, lake: Lake, mixture: Mixture, tracker: Tracker, hold: RunHold) -> Runtime:
    socket_folder = Path(tempfile.mkdtemp(prefix="rlpipe-w-"))
    shm = create_weights_folder(run_id)  # private, a random name: recorded in the Runtime and the workers' specs
    storage = config.storage
    secrets = {"s3_access_key": storage.s3_access_key, "s3_secret_key": storage.s3_secret_key}

    def spec(kind: str) -> WorkerSpec:
        python = engine_python(config) if kind == "engine" else sys.executable
        return WorkerSpec(run_id, kind, config.model_dump_json(), socket_folder, shm, secrets, python)

    try:
        engine, trainer = build_engine_client(config, spec("engine")), TrainerClient(spec("trainer"))
    except BaseException:  # e.g. no interpreter for the engine: nothing started, nothing left behind
        shutil.rmtree(socket_folder, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
        raise
    runtime = Runtime(run_id=run_id, config=config, mixture=mixture,
                      heldout=heldout_tasks(config, mixture),
                      workers=Workers(engine, trainer, socket_folder=socket_folder, weights_folder=shm),
                      records=RunRecords(lake, tracker, hold=hold))
    try:
        trainer.start()
        engine.start()
        runtime.workers.sandbox_pool = build_sandbox_pool(config, mixture)
    except BaseException:
        runtime.close()
        raise
    trainer.on_restart = lambda: _restore_fresh_trainer(runtime)
    engine.on_restart = lambda: restore_engine_version(runtime)
    return runtime


def build_engine_client(config: RunConfig, spec: WorkerSpec) -> EngineClient:
    """The engine's client: a local worker process, or with cluster.engine_on_ray an actor on
    the Ray cluster (workers/ray_engine.py, the same engine service behind the same calls)."""
    cluster = config.cluster
    if not cluster.engine_on_ray:
        return EngineClient(spec)
    from rlpipe.workers.ray_engine import RayEngineClient

    check_engine_options(config)  # an address to run on, no rollout.engine_python
    return RayEngineClient(spec, cluster.ray_address, num_cpus=cluster.ray_engine_cpus, num_gpus=cluster.ray_engine_gpus)


def build_sandbox_pool(config: RunConfig, mixture: Mixture) -> object | None:
    """A pool of pre-warmed sandboxes only when some domain runs code.

    Sandboxes an earlier crashed process of this host leaked (bwrap work dirs and cgroups,
    docker containers) are reaped before the pool starts its own. With cluster.ray_address
    set, the pools run in Ray actors on the cluster instead (each node reaps its own leaks).
    """
    if not any(env.needs_sandbox for env in mixture.envs.values()):
        return None
    from rlpipe.sandbox.base import Limits
    from rlpipe.sandbox.pool import SandboxPool

    sandbox = config.sandbox
    limits = Limits(timeout_s=sandbox.timeout_s, memory_mb=sandbox.memory_mb)
    if sandbox.backend == "docker":
        from rlpipe.sandbox.docker_backend import DockerSandbox, remove_leaked_containers

        factory, reap_leaked = (lambda: DockerSandbox(limits)), remove_leaked_containers
    else:
        from rlpipe.sandbox.bwrap import BwrapSandbox, reap_leaked_sandboxes

        factory, reap_leaked = (lambda: BwrapSandbox(limits)), reap_leaked_sandboxes
    cluster = config.cluster
    if cluster.ray_address:  # the same pools, one per actor on the cluster's nodes (sandbox/ray_pool.py)
        from rlpipe.sandbox.ray_pool import RaySandboxPool

        return RaySandboxPool(cluster.ray_address, factory, workers=cluster.ray_workers, size=sandbox.pool_size,
                              memory_mb_per_sandbox=sandbox.memory_mb, reap_leaked=reap_leaked,
                              cpus_per_worker=cluster.ray_cpus_per_worker, timeout_s=cluster.ray_timeout_s)
    return SandboxPool(factory, size=sandbox.pool_size, memory_mb_per_sandbox=sandbox.memory_mb, reap_leaked=reap_leaked)


def _restore_fresh_trainer(runtime: Runtime) -> None:
    """A trainer worker was restarted: bring it to the controller's policy version."""
    progress = runtime.progress
    if progress.trainer_in_lake:
        result = runtime.workers.trainer.restore(progress.policy_version, runtime.config.seed)
        if result.policy_version != progress.policy_version:
            raise RuntimeError(f"the restarted trainer restored policy version {result.policy_version}, "
                               f"the run is at {progress.policy_version}")
    elif progress.warm_start_begun:
        raise RuntimeError(
            f"the trainer worker of run {runtime.run_id} died during the warm-start, before checkpoint 0: "
            "there is no state to restore it from; resume the run (it warm-starts again)"
        )
