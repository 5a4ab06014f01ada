"""The trainer's update: peak memory and time of settings side by side, one fresh process per
setting, interleaved: `nice -n 19 .venv/bin/python benchmarks/update_memory.py [--config
configs/smollm2.toml|tiny] [--reps R] [--variant NAME=KEY=VALUE,KEY=VALUE ...]`.

Each child builds the run's policy and Trainer as the trainer worker does (workers/builders.py,
the config with the variant's overrides), makes synthetic samples of the recipe's shape
(benchmarks/checkpoint_memory.py's: prompts_per_step x group_size sequences of a chat
prompt's length plus max_new_tokens completion tokens, advantages +1 / -1 so that every
sample trains: the update with the most trained completions, the run's worst), runs one
update (so AdamW's moments exist, as from a run's second step on), then `--updates` measured
updates, while a thread polls its PSS (checkpoint_memory.PhasePeaks). The update's peak is
set by the micro-batch, not by how many there are: `--set rollout.prompts_per_step=4 --set
train.mini_batches_per_step=1` (one mini-batch of 32) peaks as the recipe's two do, in half the time. Printed per variant:
the peak PSS of the measured updates and of the whole child, against the trainer's state
(fp32 weights, gradients, AdamW's two moments: 16 bytes per parameter), and the wall and CPU
seconds (user + system, all threads: the work, less sensitive to a shared machine's load)
per measured update; each rep's figure, then the median. The default variants are the memory
settings before and after issue 38's item 5 and what each part contributes:

  before       micro_batch_size 32, logprob_chunk_positions 0 (the model's own logits)
  chunked      micro_batch_size 32, logits 128 positions at a time
  mb8          micro_batch_size 8,  model's own logits
  mb8+chunked  micro_batch_size 8,  logits 128 positions at a time
  gc+chunked   micro_batch_size 32, gradient checkpointing, logits 128 at a time

What it does not: generate, sync weights, checkpoint, or assert anything; the load of a shared
machine shows in the seconds (interleaving spreads its drift over all variants alike).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

GB = 1e9
DEFAULT_VARIANTS = {
    "before": ["train.micro_batch_size=32", "train.logprob_chunk_positions=0"],
    "chunked": ["train.micro_batch_size=32", "train.logprob_chunk_positions=128"],
    "mb8": ["train.micro_batch_size=8", "train.logprob_chunk_positions=0"],
    "mb8+chunked": ["train.micro_batch_size=8", "train.logprob_chunk_positions=128"],
    "gc+chunked": ["train.micro_batch_size=32", "train.logprob_chunk_positions=128", "train.gradient_checkpointing=true"],
}


def child(config_path: str, overrides: list[str], updates: int) -> None:
    """One variant in this process; prints one JSON line."""
    import torch
    from checkpoint_memory import PhasePeaks, _samples

    from rlpipe.core.config import load_config
    from rlpipe.workers.builders import build_policy, build_trainer

    peaks = PhasePeaks()
    config = load_config(None if config_path == "tiny" else config_path, overrides)
    torch.manual_seed(config.seed)
    policy, _ = build_policy(config)
    trainer = build_trainer(config, policy)
    parameters = sum(parameter.numel() for parameter in policy.parameters())
    samples = _samples(config.rollout.prompts_per_step * config.rollout.group_size, config.rollout.max_new_tokens,
                       policy.config.vocab_size, config.seed)
    peaks.enter("first update")
    trainer.update(samples, shuffle_seed=0)
    peaks.enter("updates")
    cpu_started = time.process_time()
    losses = [trainer.update(samples, shuffle_seed=1 + update).loss for update in range(updates)]
    cpu_s = time.process_time() - cpu_started
    peaks.stop()
    print(json.dumps({"parameters": parameters, "samples": len(samples), "update_s": peaks.seconds["updates"] / updates,
                      "update_cpu_s": cpu_s / updates,
                      "update_peak_kib": peaks.peaks["updates"], "peak_kib": max(peaks.peaks.values()),
                      "loss": losses[-1]}), flush=True)


def run_child(config: str, overrides: list[str], updates: int) -> dict:
    command = [sys.executable, __file__, "--child", "--config", config, "--updates", str(updates)]
    for override in overrides:
        command += ["--set", override]
    out = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    if out.returncode:
        errors = [line for line in out.stderr.splitlines() if "Error" in line]
        return {"error": f"exit {out.returncode}" + (f": {errors[-1]}" if errors else " (-9: killed, e.g. out of memory)")}
    return json.loads(out.stdout.strip().splitlines()[-1])


def wait_for_memory(gigabytes: float, patience_s: float = 600.0) -> None:
    """Sleep until /proc/meminfo's MemAvailable reaches `gigabytes` (or `patience_s` passed)."""
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        available = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                         if line.startswith("MemAvailable:"))
        if available >= gigabytes * GB:
            return
        time.sleep(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "smollm2.toml"), help="a run config, or 'tiny'")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--updates", type=int, default=1, help="measured updates per child, after the first")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE,KEY=VALUE",
                        help="instead of the default variants")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="for every variant")
    parser.add_argument("--min-available-gb", type=float, default=0.0,
                        help="on a shared machine: before each child wait (up to 10 min) for this much MemAvailable")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.config, args.overrides, args.updates)
        return
    variants = dict(DEFAULT_VARIANTS)
    if args.variant:
        variants = {name: body.split(",") for name, _, body in (v.partition("=") for v in args.variant)}
    print(f"{Path(args.config).name} --set {' '.join(args.overrides) or '-'}; {args.reps} reps interleaved; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; {os.cpu_count()} CPUs; "
          f"load {os.getloadavg()[0]:.1f}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    results: dict[str, list[dict]] = {name: [] for name in variants}
    for rep in range(1, args.reps + 1):
        for name, overrides in variants.items():
            wait_for_memory(args.min_available_gb)
            result = run_child(args.config, [*args.overrides, *overrides], args.updates)
            results[name].append(result)
            shown = result.get("error") or (f"update {result['update_s']:.1f} s ({result['update_cpu_s']:.1f} CPU s), update peak PSS "
                                            f"{result['update_peak_kib'] * 1024 / GB:.2f} GB, loss {result['loss']:.5f}")
            print(f"  rep {rep} {name:<12} {shown}; load {os.getloadavg()[0]:.1f}", flush=True)
    print("\nmedians (peak PSS of the measured updates; the trainer's state is 16 bytes per parameter):")
    for name, runs in results.items():
        done = [run for run in runs if "error" not in run]
        if not done:
            print(f"  {name:<12} failed")
            continue
        state = 16 * done[0]["parameters"]
        peak = statistics.median(run["update_peak_kib"] for run in done) * 1024
        seconds = statistics.median(run["update_s"] for run in done)
        cpu = statistics.median(run["update_cpu_s"] for run in done)
        spread = ", ".join(f"{run['update_s']:.1f}/{run['update_cpu_s']:.1f}" for run in done)
        print(f"  {name:<12} {peak / GB:5.2f} GB = {peak / state:.2f}x the state ({state / GB:.2f} GB); "
              f"{seconds:.1f} s, {cpu:.1f} CPU s per update of {done[0]['samples']} samples (reps wall/CPU {spread}); "
              f"{' '.join(variants[name])}")


if __name__ == "__main__":
    main()
