"""Builders of a worker's heavy objects from the run config: the policy and its tokenizer
(on model.device, in model.dtype), the trainer, and the config itself from the bootstrap.

Like every builder, these turn config sections into flat constructor arguments; library
code (rl/, engines/) never sees RunConfig. The light builders (lake, tracker) stay in
controller/builders.py and workers/lake_access.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlpipe.core.config import RunConfig
from rlpipe.core.errors import ConfigError
if TYPE_CHECKING:
    from rlpipe.rl.trainer import Trainer
from rlpipe.rl.char_tokenizer import policy_alphabet as domains_alphabet
from rlpipe.rl.data_parallel import RankShare
from rlpipe.rl.policy import resolve_device as rl_resolve_device
from rlpipe.rl.policy import build_char_tokenizer, build_tiny_model, load_local_model, load_local_tokenizer
from rlpipe.rl.pretrained import converted_gguf_folder

def config_from_bootstrap(boot: dict) -> RunConfig:
    """The run config a worker was started with, S3 keys included (they are excluded from
    the config's JSON and travel beside it)."""
    config = RunConfig.model_validate_json(boot["config_json"])
    secrets = {key: value for key, value in boot.get("secrets", {}).items() if value is not None}
    return config.model_copy(update={"storage": config.storage.model_copy(update=secrets)})


def resolve_device(name: str) -> str:
    """model.device as a device string (rl/policy.resolve_device: auto -> cuda:0 when CUDA has a
    device, else cpu; cuda[:N] must exist); ConfigError instead of its ValueError."""
    try:
        return str(rl_resolve_device(name))
    except ValueError as exc:
        raise ConfigError(str(exc), "use model.device=\"auto\" or \"cpu\"") from exc


def policy_alphabet(config: RunConfig) -> str:
    """The tiny model's characters for this run's domains (rl/char_tokenizer.py)."""
    return domains_alphabet(config.envs.domains)


def build_tokenizer(config: RunConfig):  # noqa: ANN201 - a transformers tokenizer
    if config.model.gguf is not None:
        return load_local_tokenizer(converted_gguf_folder(config.model.gguf))
    if config.model.path is not None:
        return load_local_tokenizer(config.model.path)
    return build_char_tokenizer(policy_alphabet(config))


def build_policy(config: RunConfig) -> tuple[torch.nn.Module, object]:
    """The trainable policy and its tokenizer: a local HF folder, or a tiny model; moved to
    model.device in model.dtype."""
    model_config = config.model
    device, dtype = resolve_device(model_config.device), model_config.dtype
    if model_config.gguf is not None:  # converted once to an HF folder beside the file (rl/pretrained.py)
        model, tokenizer = load_local_model(converted_gguf_folder(model_config.gguf), device=device, dtype=dtype)
    elif model_config.path is not None:
        model, tokenizer = load_local_model(model_config.path, device=device, dtype=dtype)
    else:
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
            device=device,
            dtype=dtype,
        )
    return model, tokenizer


DEFAULT_TIS_CAP = 2.0


def engine_dtype(config: RunConfig) -> str:
    """The rollout engine's weight dtype: rollout.engine_dtype, else model.dtype."""
    return config.rollout.engine_dtype or config.model.dtype


def tis_cap(config: RunConfig) -> float | None:
    """algo.tis_cap when set; else DEFAULT_TIS_CAP where the rows were not sampled by the
    weights the update starts from: an engine whose numerics differ from the trainer's (vllm,
    openai, or an hf engine in another rollout.engine_dtype than model.dtype: its weights are
    the trainer's rounded), or rollout.max_staleness > 0 (rows up to k versions old: without
    TIS the PPO ratio, and so the trust region, is centred on the old policy); off for a
    synchronous hf run in model.dtype, whose logprobs come from the trainer's own model code
    and weights."""
    if config.algo.tis_cap is not None:
        return config.algo.tis_cap
    on_policy = (config.rollout.engine == "hf" and config.rollout.max_staleness == 0
                 and engine_dtype(config) == config.model.dtype)
    return None if on_policy else DEFAULT_TIS_CAP


def with_lora(config: RunConfig, policy: torch.nn.Module) -> torch.nn.Module:
    """The engine's copy of the policy with the same LoRA adapter layout as the trainer's, so
    the adapter tensors the trainer syncs load by name (train.lora_rank > 0); else as is."""
    train = config.train
    if train.lora_rank == 0:
        return policy
    from rlpipe.rl.lora import apply_lora  # peft: not in the vLLM venv, whose engine takes no LoRA

    return apply_lora(policy, train.lora_rank, train.lora_alpha, train.lora_target_modules)


def build_trainer(config: RunConfig, policy: torch.nn.Module, share: RankShare = RankShare()) -> "Trainer":
    from rlpipe.rl.trainer import Trainer  # the trainer worker's only: the engine worker may run without peft

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
        clip_eps_high=algo.clip_eps_high,
        kl_coef=algo.kl_coef,
        loss_agg=algo.loss_agg,
        temperature=config.rollout.temperature,  # logprobs of the distribution the rollouts sample
        gradient_checkpointing=train.gradient_checkpointing,
        lora_rank=train.lora_rank,
        lora_alpha=train.lora_alpha,
        lora_target_modules=train.lora_target_modules,
        tis_cap=tis_cap(config),
        logprob_chunk_positions=train.logprob_chunk_positions,
        share=share,  # a rank of the trainer's torchrun group (workers/trainer_rank.py), or the only process
    )
