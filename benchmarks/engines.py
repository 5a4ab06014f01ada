"""Rollout engines side by side, in one run: `.venv/bin/python benchmarks/engines.py [--repeats 5]`.

Cases (the same prompts and sampling settings for every engine of a case):
- quickstart: configs/quickstart.toml's model shape (randomly initialised) and rollout
  settings: 128 reverse-domain prompts x 8 samples, 6 new tokens, T = 0.7, stop "\\n",
  batch_size 512;
- long: a wider model (256 wide, 4 layers), 16 prompts x 8 samples x 64 new tokens, so
  rows end at different steps (stop "\\n") and the decode dominates.

Engines (columns; a new engine is one more entry of `engine_builders`):
- hf-before: HFEngine(prefix_sharing=False, drop_finished_rows=False): every sample
  prefilled as its own row, finished rows fed padding until the batch ends;
- hf-after: HFEngine with prefix sharing and finished rows dropped (the defaults);
- vllm: engines/vllm.py's VLLMEngine, when `import vllm` works in this interpreter and the
  module exists (`make test-vllm` builds the venv that has it); else a line says so.
Both hf columns check stop strings incrementally and sample by inverse CDF (one uniform per
row and step), so they draw the same tokens; the table says whether they did. (hf-before is
therefore a little faster than the engine before this change, which decoded every row's whole
completion each step.)

Printed per case and engine: completions/s and tokens/s (median of `--repeats` timed
generate calls after one warm-up, with min-max), the ratio to hf-before, and the seconds
of `load_weights` of the model's full set of named parameters (median). Engine runs of the
repeats are interleaved, so load drift on a shared machine hits every engine alike; on a
machine shared with other work, `--threads 1` avoids the stalls of oversubscribed OpenMP
threads (at load 24 on 2 cores, 2 threads made a call 6x slower). Nothing here asserts:
numbers are for reading.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from rlpipe.core.config import load_config
from rlpipe.engines.base import RolloutEngine, SamplingParams
from rlpipe.engines.hf import HFEngine
from rlpipe.envs.reverse import ReverseEnv
from rlpipe.rl.policy import build_char_tokenizer, build_tiny_model

REPO = Path(__file__).resolve().parent.parent


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
    """One engine on one case."""

    engine: str
    completions_per_s: list[float]
    tokens_per_s: list[float]
    load_weights_s: float
    token_ids: list[tuple[int, ...]]


EngineBuilder = Callable[[torch.nn.Module, object, Case], RolloutEngine]


def cases(config_path: Path) -> list[Case]:
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


def engine_builders() -> tuple[dict[str, EngineBuilder], list[str]]:
    """({column: builder}, notes on engines left out)."""
    builders: dict[str, EngineBuilder] = {
        "hf-before": lambda model, tokenizer, case: HFEngine(
            model, tokenizer, batch_size=case.batch_size, prefix_sharing=False, drop_finished_rows=False),
        "hf-after": lambda model, tokenizer, case: HFEngine(model, tokenizer, batch_size=case.batch_size),
    }
    notes = []
    if importlib.util.find_spec("vllm") is None:
        notes.append("vllm: not installed in this venv (make test-vllm)")
    elif importlib.util.find_spec("rlpipe.engines.vllm") is None:
        notes.append("vllm: installed, but rlpipe/engines/vllm.py does not exist yet")
    else:
        builders["vllm"] = build_vllm_engine
    return builders, notes


def build_vllm_engine(model: torch.nn.Module, tokenizer: object, case: Case) -> RolloutEngine:
    """A VLLMEngine serving `model`, saved as an HF folder first (as the engine worker does)."""
    from rlpipe.engines.vllm import VLLMEngine

    folder = tempfile.mkdtemp(prefix="bench-vllm-")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return VLLMEngine(folder, tokenizer=tokenizer, dtype="float32", device="cpu", seed=0, max_model_len=case.max_position_embeddings)


def measure(case: Case, builders: dict[str, EngineBuilder], repeats: int) -> list[Measured]:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model("qwen2", len(tokenizer), case.hidden_size, case.num_layers, case.num_heads, case.intermediate_size,
                             case.max_position_embeddings, seed=0)
    tasks = ReverseEnv(max_word_len=5).tasks("train", case.prompts, seed=0)
    prompts = [(task.task_id, task.prompt) for task in tasks]
    engines = {name: build(model, tokenizer, case) for name, build in builders.items()}
    for engine in engines.values():
        engine.generate(prompts[:4], case.params)  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, list[int]] = {name: [] for name in engines}
    outputs: dict[str, list[tuple[int, ...]]] = {}
    for _ in range(repeats):
        for name, engine in engines.items():
            started = time.perf_counter()
            completions = engine.generate(prompts, case.params)
            seconds[name].append(time.perf_counter() - started)
            tokens[name].append(sum(len(c.token_ids) for c in completions))
            outputs[name] = [c.token_ids for c in completions]
    results = []
    for name, engine in engines.items():
        load_s = []
        for version in range(1, repeats + 1):
            started = time.perf_counter()
            engine.load_weights(model.named_parameters(), version)
            load_s.append(time.perf_counter() - started)
        completions_per_s = [len(prompts) * case.params.n / s for s in seconds[name]]
        tokens_per_s = [count / s for count, s in zip(tokens[name], seconds[name])]
        results.append(Measured(name, completions_per_s, tokens_per_s, statistics.median(load_s), outputs[name]))
    return results


def print_table(case: Case, results: list[Measured]) -> None:
    params = case.params
    print(f"\n## {case.name}: hidden {case.hidden_size} x {case.num_layers} layers, {case.prompts} prompts x {params.n} samples, "
          f"{params.max_new_tokens} new tokens, T={params.temperature}, stop={params.stop!r}, batch_size {case.batch_size}")
    print(f"{'engine':<10} {'completions/s (min-max)':>26} {'tokens/s (min-max)':>26} {'x hf-before':>11} {'load_weights s':>15}")
    baseline = statistics.median(results[0].completions_per_s)
    for result in results:
        cps, tps = result.completions_per_s, result.tokens_per_s
        print(f"{result.engine:<10} {_spread(cps):>26} {_spread(tps):>26} {statistics.median(cps) / baseline:>10.2f}x "
              f"{result.load_weights_s:>15.4f}")
    by_name = {result.engine: result for result in results}
    if "hf-before" in by_name and "hf-after" in by_name:
        same = by_name["hf-before"].token_ids == by_name["hf-after"].token_ids
        print(f"hf-before and hf-after sampled the same tokens: {'yes' if same else 'NO'}")


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timed generate calls per engine and case")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart.toml"))
    parser.add_argument("--case", action="append", help="run only these cases (quickstart, long)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    builders, notes = engine_builders()
    print(f"torch {torch.__version__}, {args.threads} threads, {args.repeats} repeats; engines: {', '.join(builders)}")
    for note in notes:
        print(note)
    for case in cases(Path(args.config)):
        if args.case and case.name not in args.case:
            continue
        print_table(case, measure(case, builders, args.repeats))


if __name__ == "__main__":
    main()
