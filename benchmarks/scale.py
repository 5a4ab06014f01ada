"""One real RL step of a Qwen2.5-0.5B-shaped model on this CPU, with the peak memory of every
process: `.venv/bin/python benchmarks/scale.py [--model PATH] [--variant NAME ...]`.

The model: Qwen2.5-0.5B's shape built from its config (hidden 896, 24 layers, 14 heads, 2 KV
heads, intermediate 4864, vocabulary 151936, tied embeddings, rope theta 1e6), randomly
initialised, then `--prime-steps` (10) supervised steps (rl/warmstart.py) on the run's
arithmetic tasks (a+b, a and b in 0..3), saved as a local HF folder with rlpipe's character
tokenizer (its ~60 ids are all below the vocabulary size, so controller/model_checks.py's pre-flight
accepts it). Why the priming: a purely random model is never right, so every reward is 0, every
GRPO advantage is 0 and the trainer skips the update (no gradient, no AdamW state): the step
would measure nothing of the update. Primed, it answers a digit, right about 1 time in 5, so
rewards differ within a group and the update trains. Or `--model PATH`: any local HF folder
with its tokenizer (then rewards may all be 0: the printed train/grad_norm says so).

Each variant is a real `rlpipe train` run through the workers (controller, engine worker,
trainer worker, Prefect's temporary server): model.path = that folder, no warm start, 4 prompts x
4 samples x 32 new tokens of that arithmetic domain, train.steps = 1, 4 held-out tasks. While it
runs, /proc/PID/status of the CLI and all its descendants is polled (every 0.2 s) for VmHWM,
the peak resident set of each process, and for RssAnon; the run's weight-sync folder
(/dev/shm/rlpipe-<run id>) is polled for the bytes of its files. Printed per variant: the step
time (`time/step_s` of the lake's step metrics), the peak of each process, their sum, and the
sum against 6x the fp32 weight size (parameters x 4 bytes). VmHWM counts mapped file pages
(shared libraries, the model file from_pretrained maps) but not a file on /dev/shm that no
process maps: the weight-sync files are written and read with write()/read(). So a second sum
counts private memory: the polled peak of each process's RssAnon plus the peak of the sync
folder; polling every 0.2 s can miss a short peak, so that sum is a lower bound.

Or `--recipe FILE [--steps N]`: that config as a user runs it (its model, e.g. SmolLM2 from
its GGUF, its domains and prompts and its rollout sizes), run from the repository root with no
warm start, no checkpoint and no mid-run evaluation, N RL steps per variant; each step metric
is then the median over steps 2.. (the first pays one-time costs). E.g. LoRA against full
fine-tuning of SmolLM2-135M-Instruct on the math recipe:
`benchmarks/scale.py --recipe configs/smollm2_math.toml --steps 4 --variant fp32 --variant lora`.

Variants (rows): fp32 (full fine-tuning, the defaults), gc (train.gradient_checkpointing),
bf16 (model.dtype = bfloat16: the engine's and the trainer's weights in bf16, but the trainer
keeps fp32 master weights, fp32 gradients and fp32 AdamW states, rl/precision.py), lora (rank 8 on
every linear layer: only the adapter has gradients and AdamW states).

What it measured, with the machine, date and load of each run: docs/RESULTS.md,
"Memory of one RL step at Qwen2.5-0.5B's shape".

What it does not do: assert anything, measure a GPU, or measure more than one step (the first
step includes no warm-up beyond the engine's own).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))  # process_peaks, next to this file
from process_peaks import ProcessPeak, run_watched  # noqa: E402

from rlpipe.workers.shm import folder_prefix, shm_base  # noqa: E402 - torch-free: where the run's /dev/shm folder appears

GIB = 1024**3
MAX_OPERAND = 3  # arithmetic a+b, a and b in 0..3: answers 0..6, guessable by a barely trained model

VARIANTS: dict[str, list[str]] = {
    "fp32": [],
    "gc": ["train.gradient_checkpointing=true"],
    "bf16": ["model.dtype=\"bfloat16\""],
    "lora": ["train.lora_rank=8"],
}


def build_qwen05b_folder(folder: Path, prime_steps: int) -> int:
    """Qwen2.5-0.5B's shape, random init, `prime_steps` supervised steps on the run's
    arithmetic tasks, saved with the char tokenizer; returns the parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlpipe.envs.arithmetic import ArithmeticEnv
    from rlpipe.rl.policy import build_char_tokenizer
    from rlpipe.rl.warmstart import warm_start

    tokenizer = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, max_position_embeddings=32768, rope_theta=1_000_000.0, tie_word_embeddings=True,
        rms_norm_eps=1e-6, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    count = sum(p.numel() for p in model.parameters())  # tied: the embedding counted once
    tasks = ArithmeticEnv(max_operand=MAX_OPERAND).tasks("train", 64, seed=0)
    losses = warm_start(model, tokenizer, [(t.prompt, t.reference_answer) for t in tasks], prime_steps, batch_size=16, lr=3e-4, seed=0)
    print(f"primed with {prime_steps} supervised steps: answer loss {losses[0]:.2f} -> {losses[-1]:.2f}" if losses else "not primed")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return count


def parameter_count(folder: Path) -> int:
    """Parameters of a saved model (tied weights once), built on the meta device: no memory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    return sum(p.numel() for p in model.parameters())


def recipe_parameter_count(recipe: Path) -> int:
    """Parameters of a recipe's model (model.path, or the folder its GGUF converts to)."""
    from rlpipe.core.config import load_config
    from rlpipe.rl.gguf_folder import converted_folder

    model = load_config(recipe, []).model
    return parameter_count(Path(model.path) if model.path else converted_folder(Path(model.gguf)))


def write_config(path: Path, model: Path, lake: Path) -> None:
    path.write_text(f"""
[model]
path = "{model}"
device = "cpu"

[envs]
domains = {{ arithmetic = 1.0 }}
max_operand = {MAX_OPERAND}
heldout_size = 4
train_size = 64

[warmstart]
steps = 0

[rollout]
prompts_per_step = 4
group_size = 4
max_new_tokens = 32
batch_size = 16

[train]
steps = 1
micro_batch_size = 16

[checkpoint]
every_steps = 1000

[storage]
lake_uri = "{lake}"
""")


@dataclass(frozen=True)
class Result:
    variant: str
    returncode: int
    metrics: dict[str, float]
    peaks: list[ProcessPeak]
    shm_peak: int
    wall_s: float
    tail: str


def mem_available_gib() -> float:
    """MemAvailable of /proc/meminfo: a run whose processes need more is OOM-killed (a worker
    killed so is restarted by the retried task, and killed again)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / GIB
    return float("nan")


def run_variant(name: str, overrides: list[str], model: Path | None, work: Path, threads: int,
                recipe: Path | None = None, steps: int = 1) -> Result:
    """One `rlpipe train` of `steps` RL steps: the built-in arithmetic config on `model`, or the
    `recipe` file (its model, domains and prompts) with its sizes set for a short run."""
    lake = work / f"lake-{name}"
    run_id = f"scale-{name}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads),
           "PREFECT_HOME": str(work / f"prefect-{name}")}
    if recipe is None:
        config = work / f"{name}.toml"
        write_config(config, model, lake)
        overrides = [f"train.steps={steps}", *overrides]
    else:
        config = recipe
        overrides = [f'storage.lake_uri="{lake}"', f"train.steps={steps}", "checkpoint.every_steps=1000",
                     "eval.every_steps=0", "envs.heldout_size=4", "warmstart.steps=0", *overrides]
    command = [sys.executable, "-m", "rlpipe.cli.main", "train", str(config), "--run-id", run_id]
    for override in overrides:
        command += ["--set", override]
    log = work / f"{name}.log"
    returncode, wall_s, watch = run_watched(command, REPO if recipe else work, env, log, shm_base() / folder_prefix(run_id))
    metrics = _step_metrics(lake / "runs" / run_id / "steps", steps)
    shutil.rmtree(lake, ignore_errors=True)
    tail = "\n".join(log.read_text().splitlines()[-15:])
    return Result(name, returncode, metrics, sorted(watch.peaks.values(), key=lambda p: -p.vmhwm_kib), watch.shm_peak, wall_s, tail)


def _step_metrics(steps_folder: Path, steps: int) -> dict[str, float]:
    """The step metrics of the run (MANIFEST.json and TRAIN.json of each step): step 1's if it
    ran one step, else each metric's median over steps 2.. (step 1 pays the engine's and the
    trainer's first-call costs)."""
    per_step: list[dict[str, float]] = []
    for step in range(1, steps + 1):
        metrics: dict[str, float] = {}
        for document in ("MANIFEST.json", "TRAIN.json"):
            path = steps_folder / f"{step:06d}" / document
            if path.exists():
                metrics |= dict(json.loads(path.read_text())["metrics"])
        per_step.append(metrics)
    measured = per_step[1:] if steps > 1 else per_step
    names = {name for metrics in measured for name in metrics}
    return {name: statistics.median(m[name] for m in measured if name in m) for name in names}


def print_result(result: Result, weights_bytes: int) -> None:
    bound = 6 * weights_bytes
    counted = [p for p in result.peaks if p.vmhwm_kib > 0]
    # a worker that died and was restarted (a retried task) is two processes of one role, one
    # after the other: the sum takes each role's largest
    by_role: dict[str, list[ProcessPeak]] = {}
    for peak in counted:
        by_role.setdefault(peak.role, []).append(peak)
    total = sum(max(p.vmhwm_kib for p in peaks) for peaks in by_role.values()) * 1024
    step_s = result.metrics.get("time/step_s")
    step = f"FAILED (exit {result.returncode})" if result.returncode else f"{step_s:.1f} s" if step_s is not None else "no metric"
    print(f"\n## {result.variant}: step {step} (generate {result.metrics.get('time/generate_s', float('nan')):.1f} s, "
          f"update {result.metrics.get('time/update_s', float('nan')):.1f} s, sync {result.metrics.get('time/sync_s', float('nan')):.1f} s), "
          f"run wall {result.wall_s:.0f} s; reward/mean {result.metrics.get('reward/mean', float('nan')):.3f}, "
          f"train/grad_norm {result.metrics.get('train/grad_norm', float('nan')):.3g} (0: every advantage was 0, nothing trained)")
    for peak in counted:
        if peak.vmhwm_kib * 1024 >= 0.05 * GIB:
            print(f"  {peak.role:<18} pid {peak.pid:<8} VmHWM {peak.vmhwm_kib * 1024 / GIB:6.2f} GiB "
                  f"(RssAnon peak, polled: {peak.anon_kib * 1024 / GIB:5.2f} GiB)")
    small = [p for p in counted if p.vmhwm_kib * 1024 < 0.05 * GIB]
    if small:
        print(f"  {len(small)} more processes under 0.05 GiB each: {sum(p.vmhwm_kib for p in small) / 1024**2:.2f} GiB")
    print(f"  sum (per role) {total / GIB:.2f} GiB = {total / weights_bytes:.2f}x fp32 weights; "
          f"6x = {bound / GIB:.2f} GiB: {'UNDER' if total <= bound else 'OVER'}")
    restarted = [f"{role} x{len(peaks)}" for role, peaks in by_role.items() if len(peaks) > 1 and role.endswith("worker")]
    if restarted:
        print(f"  restarted during the run (each role's largest counted once): {', '.join(restarted)}")
    private = sum(max(p.anon_kib for p in peaks) for peaks in by_role.values()) * 1024 + result.shm_peak
    print(f"  private memory only (each role's RssAnon peak + the /dev/shm peak {result.shm_peak / GIB:.2f} GiB; "
          f"no page cache of model files): {private / GIB:.2f} GiB = {private / weights_bytes:.2f}x")
    if result.returncode:
        print("  last lines of the run:\n    " + result.tail.replace("\n", "\n    "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a local HF folder with its tokenizer (default: a Qwen2.5-0.5B-shaped random model)")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS), help="run only these variants (default: all)")
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of the run's processes")
    parser.add_argument("--keep", type=Path, help="keep the work folder here (model, configs, logs)")
    parser.add_argument("--prime-steps", type=int, default=10,
                        help="supervised steps on the run's tasks before saving the random model, so that rewards differ "
                             "within a group (else every advantage is 0 and the trainer skips the update)")
    parser.add_argument("--recipe", type=Path, help="run this config file (its model, domains and prompts: e.g. "
                        "configs/smollm2_math.toml) with no warm start, checkpoint or mid-run evaluation, instead of "
                        "the built-in arithmetic config; --model is then not needed")
    parser.add_argument("--steps", type=int, default=1, help="RL steps per variant (more than 1: each step metric is "
                        "the median over steps 2.., the first pays one-time costs)")
    parser.add_argument("--build-only", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_only:
        build_qwen05b_folder(args.build_only, args.prime_steps)
        return
    work = Path(args.keep or tempfile.mkdtemp(prefix="rlpipe-scale-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        if args.recipe:
            model = None
            count = recipe_parameter_count(args.recipe)
        elif args.model:
            model = args.model.resolve()
            count = parameter_count(model)
        elif (work / "qwen05b" / "config.json").exists():
            model, count = work / "qwen05b", parameter_count(work / "qwen05b")
        else:
            model = work / "qwen05b"
            started = time.perf_counter()
            # in a child process: the build's memory (weights, AdamW states of the priming) is
            # returned to the system before the runs are measured
            subprocess.run([sys.executable, __file__, "--build-only", str(model), "--prime-steps", str(args.prime_steps)],
                           check=True, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(args.threads)})
            count = parameter_count(model)
            print(f"built {model} in {time.perf_counter() - started:.0f} s")
        weights = count * 4
        shape = f"{args.recipe}'s sizes" if args.recipe else "4 prompts x 4 samples x 32 new tokens"
        print(f"model {args.recipe or model}: {count:,} parameters, fp32 weights {weights / GIB:.2f} GiB, "
              f"6x = {6 * weights / GIB:.2f} GiB; {shape}, {args.steps} RL step(s), OMP_NUM_THREADS={args.threads}")
        for name in args.variant or list(VARIANTS):
            print(f"\n{name}: {', '.join(VARIANTS[name]) or 'defaults'}; MemAvailable before it {mem_available_gib():.1f} GiB")
            print_result(run_variant(name, VARIANTS[name], model, work, args.threads, args.recipe, args.steps), weights)
            sys.stdout.flush()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
