"""Builds the heavy objects of a run once per flow run, and hands them to tasks.

Tasks reach the Runtime through `get_runtime(run_id)`, a process-local registry, never
through task arguments: Prefect hashes and serializes task inputs, and a model, an
optimizer or a client must never pass through it. The builders here are the only code
that reads RunConfig sections; they turn them into flat constructor arguments.

Not here: any RL logic (rl/), storage layout (storage/), or orchestration (flows/).
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field

import torch

from rlpipe.core.config import RunConfig
from rlpipe.core.errors import ConfigError
from rlpipe.core.records import Task
from rlpipe.core.seeds import derive_seed
from rlpipe.engines.hf import HFEngine
from rlpipe.envs.mixture import Mixture, build_env
from rlpipe.rl.pretrained import load_gguf_model
from rlpipe.rl.policy import DEFAULT_ALPHABET, build_char_tokenizer, build_tiny_model, load_local_model
from rlpipe.rl.trainer import Trainer
from rlpipe.storage.lake import Lake
from rlpipe.storage.tracking import Tracker
from rlpipe.tasks.builders import build_lake, build_tracker

_RUNTIMES: dict[str, "Runtime"] = {}


@dataclass
class Runtime:
    """Everything one RL run holds in memory. One per run per process."""

    run_id: str
    config: RunConfig
    lake: Lake
    tracker: Tracker
    mixture: Mixture
    heldout: list[Task]
    tokenizer: object
    policy: torch.nn.Module
    trainer: Trainer
    engine: HFEngine
    policy_version: int = 0
    mlflow_run_id: str = ""
    incarnation: str = ""  # run.json's created_at: tells a run apart from an earlier one of the same id
    step_metrics: list[dict[str, float]] = field(default_factory=list)
    sandbox_pool: object | None = None

    def close(self) -> None:
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


def build_policy(config: RunConfig) -> tuple[torch.nn.Module, object]:
    """The trainable policy and its tokenizer: a local HF folder, or a tiny model."""
    model_config = config.model
    if model_config.gguf is not None:
        return load_gguf_model(model_config.gguf)
    if model_config.path is not None:
        return load_local_model(model_config.path)
    tokenizer = build_char_tokenizer(policy_alphabet(config))
    model = build_tiny_model(
        architecture=model_config.architecture,
        vocab_size=len(tokenizer),
        hidden_size=model_config.hidden_size,
        num_layers=model_config.num_layers,
        num_heads=model_config.num_heads,
        intermediate_size=model_config.intermediate_size,
        max_position_embeddings=model_config.max_position_embeddings,
        seed=config.seed,
    )
    return model, tokenizer


def policy_alphabet(config: RunConfig) -> str:
    """The tiny model's characters: DEFAULT_ALPHABET, and with the code domain also the rest
    of printable ASCII (capitals for True/None, `%`, `@`, `|`, tab...), appended so that the
    ids of the default characters, and runs without code, do not change. Anything else
    (HumanEval's few non-ASCII prompt characters) encodes as <unk>."""
    if "code" not in config.envs.domains:
        return DEFAULT_ALPHABET
    return DEFAULT_ALPHABET + "".join(sorted(set(string.printable) - set(DEFAULT_ALPHABET)))


def build_mixture(config: RunConfig) -> Mixture:
    envs_config = config.envs
    envs = {
        name: build_env(name, max_operand=envs_config.max_operand, max_word_len=envs_config.max_word_len,
                        timeout_s=config.sandbox.timeout_s)
        for name in envs_config.domains
    }
    return Mixture(envs, dict(envs_config.domains))


def step_tasks(runtime: "Runtime", step: int) -> list[Task]:
    """The tasks of RL step `step`: a function of (run seed, step) alone."""
    count = runtime.config.rollout.prompts_per_step
    tasks = runtime.mixture.sample(count, rng_seed=derive_seed(runtime.config.seed, step, "sample"))
    if len({task.task_id for task in tasks}) != len(tasks):
        raise ConfigError(
            f"step {step} drew the same task twice: rollout.prompts_per_step={count} is larger than a domain's training split",
            "lower rollout.prompts_per_step or widen the domain (e.g. envs.max_operand; a GRPO group is one task's samples)",
        )
    return tasks


def build_trainer(config: RunConfig, policy: torch.nn.Module) -> Trainer:
    train, algo = config.train, config.algo
    return Trainer(
        policy,
        lr=train.lr,
        weight_decay=train.weight_decay,
        grad_clip=train.grad_clip,
        micro_batch_size=train.micro_batch_size,
        epochs_per_step=train.epochs_per_step,
        mini_batches_per_step=train.mini_batches_per_step,
        clip_eps=algo.clip_eps,
        kl_coef=algo.kl_coef,
        loss_agg=algo.loss_agg,
        temperature=config.rollout.temperature,  # logprobs of the distribution the rollouts sample
    )


def build_sandbox_pool(config: RunConfig, mixture: Mixture) -> object | None:
    """A pool of pre-warmed sandboxes only when some domain runs code.

    Sandboxes an earlier crashed process of this host leaked (bwrap work dirs and cgroups,
    docker containers) are reaped before the pool starts its own.
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
    return SandboxPool(factory, size=sandbox.pool_size, memory_mb_per_sandbox=sandbox.memory_mb, reap_leaked=reap_leaked)


def build_runtime(run_id: str, config: RunConfig) -> Runtime:
    """Build every part. Fails on bad input (missing model, unreachable lake) before
    anything is written anywhere."""
    torch.manual_seed(config.seed)
    policy, tokenizer = build_policy(config)
    lake = build_lake(config)
    mixture = build_mixture(config)
    tracker = build_tracker(config)
    engine = HFEngine(policy, tokenizer, batch_size=config.rollout.batch_size, prompt_format=config.model.prompt_format)
    runtime = Runtime(
        run_id=run_id,
        config=config,
        lake=lake,
        tracker=tracker,
        mixture=mixture,
        heldout=mixture.heldout(config.envs.heldout_size, seed=config.seed),
        tokenizer=tokenizer,
        policy=policy,
        trainer=build_trainer(config, policy),
        engine=engine,
        sandbox_pool=build_sandbox_pool(config, mixture),
    )
    register_runtime(runtime)
    return runtime


def preflight(config: RunConfig) -> None:
    """Check the inputs a run needs (domains, the model against them, lake reachable)
    without building the model: bad input fails here, before any flow run. The lake is
    opened last, and made if missing (only `train` creates a lake), once the input is good."""
    from rlpipe.tasks.model_checks import check_folder_model, check_gguf_model, check_positions

    mixture = build_mixture(config)
    if config.model.gguf is not None:
        check_gguf_model(config, mixture)
    elif config.model.path is not None:
        check_folder_model(config, mixture)
    else:
        check_positions(config, mixture, build_char_tokenizer(policy_alphabet(config)),
                        config.model.max_position_embeddings, "model.max_position_embeddings",
                        "raise model.max_position_embeddings")
    build_lake(config, create=True)
