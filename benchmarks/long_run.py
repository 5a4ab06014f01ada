"""What a long run costs besides its steps, side by side in one run: `nice -n 5
.venv/bin/python benchmarks/long_run.py [--model smollm2|tiny] [--steps N] [--reps R] [--set K=V]`.

Three variants of the same `rlpipe train` (the CLI as a user runs it, its own temporary
Prefect server, lake, MLflow sqlite file and Prefect home each), run interleaved (none,
ckpt4, eval, none, ckpt4, eval, ...) so that the load of a shared machine drifts over all
alike:
  none   no checkpoint but the run's first and last, evaluation only before and after RL
  ckpt4  checkpoint.every_steps = 4 (retention's default keep_last)
  eval   eval.every_steps = 4 on envs.heldout_size = 200 held-out problems
  lowmem (only with --variant lowmem) `none` with the update's low-memory settings:
         train.micro_batch_size = 8, the LM head's logits 128 positions at a time
         (train.logprob_chunk_positions = 128); `--variant none --variant lowmem` compares
         the step time and peak memory of the recipe's settings against those, interleaved
  lowmem_gc (opt-in) lowmem with gradient checkpointing (train.gradient_checkpointing)
with N RL steps (default 6). `--model smollm2`: configs/smollm2.toml (`make smollm2` first);
`--model tiny`: the small default model on 4 x 4 arithmetic rollouts, a smoke run.
none and ckpt4 hold 20 held-out problems: their evaluations (before and after RL) are outside
what is timed, so only their start and end get shorter.

Measured per run: the span from step 1's MANIFEST.json (written when step 1's rows are
committed) to step N's TRAIN.json (step N's update done): N-1 updates and the checkpoints and
evaluations made after steps 1..N-1 (with N = 6: one checkpoint and one evaluation, after
step 4, then 2 more steps in which a background write that slows the steps after it is
counted). The cost of one event is the span's extra time over none's, per event; it is
printed as a share of the wall time at the issue's frequencies: that extra time over the
time of 4 of none's steps (a checkpoint every 4 steps) and over 8 (an evaluation every 8:
an evaluation's cost does not depend on how often it runs). Also: the whole command's
wall time, the median `time/step_s`, the lake's disk use after N steps (total and
checkpoints/), the load average before and after, and the memory of every process of the
run (process_peaks.Watch, every 0.5 s): peak PSS per process with its anonymous / file /
shmem split at that moment, VmHWM, the peak of the summed PSS at one poll, and the peak of
the /dev/shm weight-sync folder. The memory goal is set against the state the run must
hold: fp32 weights, gradients and AdamW's two moments in the trainer plus the engine's
weights, 5 x 4 bytes per parameter. Then the memory reference: the same step's work in one
plain PyTorch process (benchmarks/plain_step.py), its peak PSS against its own state (4 x 4
bytes per parameter).

Within the `eval` run itself: the evaluation after step 4, from step 4's TRAIN.json to its
evals/step_000004.json (whatever runs between them, the weight sync, included), over 8 of
the same run's median steps: a share taken at one load, less exposed than the span ratio to
the load of a shared machine drifting between runs; and the same in CPU seconds of the run's
processes (user + sys, polled): the evaluation's against a median step's (TRAIN.json to the
next, steps with no event after the one before), the work whatever the load. `--set KEY=VALUE` (repeatable) applies
an override to every variant (e.g. rollout.engine_dtype, rollout.engine).

Goals beside the ratios (issue 38): a checkpoint every 4 steps <= 3% of the wall time;
evaluation every 8 steps on 200 held-out problems <= 5%; the summed peak <= 1.5x the state.

What it does not: assert anything (it prints), measure a GPU, or isolate the machine: the
load average is printed beside each run, and only ratios of one interleaved run count.
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
sys.path.insert(0, str(REPO / "benchmarks"))
from process_peaks import ProcessPeak, run_watched  # noqa: E402

from rlpipe.workers.shm import folder_prefix, shm_base  # noqa: E402 - torch-free

GB = 1e9
EVENT_EVERY = 4  # the step after which each measured checkpoint or evaluation happens, and its period
VARIANTS: dict[str, list[str]] = {
    "none": ["checkpoint.every_steps=1000", "eval.every_steps=0", "envs.heldout_size=20"],
    "ckpt4": [f"checkpoint.every_steps={EVENT_EVERY}", "eval.every_steps=0", "envs.heldout_size=20"],
    "eval": ["checkpoint.every_steps=1000", f"eval.every_steps={EVENT_EVERY}", "envs.heldout_size=200"],
    # `none` with the update's low-memory settings (opt-in: --variant lowmem): micro-batches of 8
    # sequences, the LM head's logits 128 positions at a time (rl/chunked_logprobs.py)
    "lowmem": ["checkpoint.every_steps=1000", "eval.every_steps=0", "envs.heldout_size=20",
               "train.micro_batch_size=8", "train.logprob_chunk_positions=128"],
    "lowmem_gc": ["checkpoint.every_steps=1000", "eval.every_steps=0", "envs.heldout_size=20",
                  "train.micro_batch_size=8", "train.logprob_chunk_positions=128", "train.gradient_checkpointing=true"],
}
DEFAULT_VARIANTS = ("none", "ckpt4", "eval")
GOAL_EVERY = {"ckpt4": 4, "eval": 8}  # the frequencies of the goals
GOALS = {"ckpt4": 0.03, "eval": 0.05}
MEMORY_GOAL = 1.5
TINY_TOML = """\
[envs]
domains = { arithmetic = 1.0 }
[warmstart]
steps = 5
batch_size = 16
[rollout]
prompts_per_step = 4
group_size = 4
"""


@dataclass(frozen=True)
class RunResult:
    variant: str
    rep: int
    returncode: int
    wall_s: float
    span_s: float | None
    span_cpu_s: float | None  # the run's processes' CPU seconds over that span
    eval_s: float | None  # the evaluation after step EVENT_EVERY, within the run (eval variant)
    step_s_median: float | None
    eval_cpu_s: float | None  # the run's processes' CPU seconds over that evaluation
    step_cpu_s_median: float | None  # ... over one step: TRAIN.json to TRAIN.json, steps without an event
    checkpoint_writes: tuple[tuple[int, float, float], ...]  # (step, write_s, write_cpu_s) from CHECKPOINT.json, steps 1..N-1
    checkpoint_wait_s: float  # summed time/checkpoint_wait_s of steps 1..N: the updates held by a write
    lake_bytes: int
    checkpoint_bytes: int
    load_before: float
    load_after: float
    peaks: list[ProcessPeak]
    pss_sum_peak_kib: int
    shm_peak: int
    tail: str


def _tree_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) if folder.exists() else 0


def _step_document(lake: Path, run_id: str, step: int, name: str) -> Path:
    return lake / "runs" / run_id / "steps" / f"{step:06d}" / name


def run_variant(name: str, rep: int, config: Path, base: list[str], work: Path, threads: int) -> RunResult:
    run_id = f"long-{name}-{rep}"
    lake, folder = work / f"lake-{run_id}", work / run_id
    folder.mkdir(parents=True, exist_ok=True)
    overrides = [*base, *VARIANTS[name], f'storage.lake_uri="{lake}"', f'tracking.mlflow_uri="sqlite:///{folder / "mlflow.db"}"']
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_API", "RLPIPE_FAILPOINTS"))}
    env |= {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads), "PREFECT_HOME": str(folder / "prefect-home"),
            "RLPIPE_HOME": str(folder / "rlpipe-home"), "PREFECT_LOGGING_LEVEL": "WARNING"}
    command = [sys.executable, "-m", "rlpipe.cli.main", "train", str(config), "--run-id", run_id]
    for override in overrides:
        command += ["--set", override]
    load_before = os.getloadavg()[0]
    log = folder / "train.log"
    returncode, wall_s, watch = run_watched(command, REPO, env, log, shm_base() / folder_prefix(run_id),
                                            pss=True, interval_s=0.5)
    steps = int(next(o.split("=", 1)[1] for o in base if o.startswith("train.steps=")))
    first, last = _step_document(lake, run_id, 1, "MANIFEST.json"), _step_document(lake, run_id, steps, "TRAIN.json")
    span_s = last.stat().st_mtime - first.stat().st_mtime if first.exists() and last.exists() else None
    span_cpu_s = watch.cpu_between(first.stat().st_mtime, last.stat().st_mtime) if span_s is not None else None
    evaluated = lake / "runs" / run_id / "evals" / f"step_{EVENT_EVERY:06d}.json"
    trained = _step_document(lake, run_id, EVENT_EVERY, "TRAIN.json")
    eval_s = evaluated.stat().st_mtime - trained.stat().st_mtime if evaluated.exists() and trained.exists() else None
    step_times, checkpoint_wait_s = [], 0.0
    for step in range(1, steps + 1):
        path = _step_document(lake, run_id, step, "TRAIN.json")
        if path.exists():
            metrics = dict(json.loads(path.read_text())["metrics"])
            step_times.append(float(metrics.get("time/step_s", float("nan"))))
            checkpoint_wait_s += float(metrics.get("time/checkpoint_wait_s", 0.0))
    eval_cpu_s = (watch.cpu_between(trained.stat().st_mtime, evaluated.stat().st_mtime)
                  if evaluated.exists() and trained.exists() else None)
    ends = {step: _step_document(lake, run_id, step, "TRAIN.json") for step in range(1, steps + 1)}
    step_cpu = [watch.cpu_between(ends[step - 1].stat().st_mtime, ends[step].stat().st_mtime) for step in range(2, steps + 1)
                if (step - 1) % EVENT_EVERY and ends[step - 1].exists() and ends[step].exists()]  # no event after step - 1
    step_cpu = [cpu for cpu in step_cpu if cpu is not None]
    writes = []
    for step in range(EVENT_EVERY, steps, EVENT_EVERY):
        marker = lake / "checkpoints" / run_id / f"step={step:06d}" / "CHECKPOINT.json"
        info = json.loads(marker.read_text()) if marker.exists() else {}
        if info.get("write_cpu_s") is not None:
            writes.append((step, float(info["write_s"]), float(info["write_cpu_s"])))
    result = RunResult(name, rep, returncode, wall_s, span_s, span_cpu_s, eval_s, statistics.median(step_times) if step_times else None,
                       eval_cpu_s, statistics.median(step_cpu) if step_cpu else None, tuple(writes), checkpoint_wait_s,
                       _tree_bytes(lake), _tree_bytes(lake / "checkpoints"), load_before, os.getloadavg()[0],
                       sorted(watch.peaks.values(), key=lambda p: -p.pss_kib), watch.pss_sum_peak_kib, watch.shm_peak,
                       "\n".join(log.read_text().splitlines()[-12:]))
    shutil.rmtree(lake, ignore_errors=True)  # measured; --keep keeps the logs, not the checkpoints' gigabytes
    return result


def print_run(result: RunResult) -> None:
    status = f"exit {result.returncode}" if result.returncode else "ok"
    span = f"{result.span_s:.1f} s" if result.span_s is not None else "n/a"
    if result.span_cpu_s is not None:
        span += f" ({result.span_cpu_s:.1f} CPU s)"
    step = f"{result.step_s_median:.2f} s" if result.step_s_median is not None else "n/a"
    print(f"{result.variant:<6} rep {result.rep}: {status}, wall {result.wall_s:.0f} s, span steps 1..N {span}, "
          f"median step {step}, lake {result.lake_bytes / GB:.2f} GB (checkpoints {result.checkpoint_bytes / GB:.2f} GB), "
          f"peak summed PSS {result.pss_sum_peak_kib * 1024 / GB:.2f} GB, load {result.load_before:.1f} -> {result.load_after:.1f}",
          flush=True)
    if result.eval_s is not None and result.step_s_median:
        share = result.eval_s / (GOAL_EVERY["eval"] * result.step_s_median)
        print(f"  within this run: the evaluation after step {EVENT_EVERY} took {result.eval_s:.1f} s (step "
              f"{EVENT_EVERY}'s TRAIN.json to evals/step_{EVENT_EVERY:06d}.json) = {share:.1%} of {GOAL_EVERY['eval']} of its "
              f"median steps (goal <= {GOALS['eval']:.0%}: {'MET' if share <= GOALS['eval'] else 'NOT MET'})", flush=True)
    if result.eval_cpu_s is not None and result.step_cpu_s_median:
        share = result.eval_cpu_s / (GOAL_EVERY["eval"] * result.step_cpu_s_median)
        print(f"  in CPU seconds of the run's processes (user + sys, less exposed to the load): the evaluation "
              f"{result.eval_cpu_s:.1f} s, a median step {result.step_cpu_s_median:.1f} s: {share:.1%} of "
              f"{GOAL_EVERY['eval']} steps", flush=True)
    if result.checkpoint_writes and result.step_cpu_s_median:
        each = ", ".join(f"step {step}: {wall:.1f} s wall, {cpu:.1f} CPU s" for step, wall, cpu in result.checkpoint_writes)
        share = statistics.median(cpu for _, _, cpu in result.checkpoint_writes) / (GOAL_EVERY["ckpt4"] * result.step_cpu_s_median)
        print(f"  checkpoint writes (CHECKPOINT.json; CPU of the writing thread): {each}; the median write's CPU = "
              f"{share:.1%} of the CPU of {GOAL_EVERY['ckpt4']} median steps ({result.step_cpu_s_median:.1f} CPU s each); "
              f"updates held by a write: {result.checkpoint_wait_s:.2f} s in all (time/checkpoint_wait_s)", flush=True)
    if result.returncode:
        print("  last lines:\n    " + result.tail.replace("\n", "\n    "), flush=True)


def _by_role(peaks: list[ProcessPeak]) -> dict[str, ProcessPeak]:
    """Each role's largest PSS peak (a restarted worker is two processes of one role)."""
    roles: dict[str, ProcessPeak] = {}
    for peak in peaks:
        if peak.pss_kib and (peak.role not in roles or peak.pss_kib > roles[peak.role].pss_kib):
            roles[peak.role] = peak
    return roles


def print_memory(result: RunResult, state_bytes: int, label: str) -> None:
    roles = _by_role(result.peaks)
    print(f"\nmemory of {label} (PSS peak per process; its anon / file / shmem split at that poll; VmHWM; RssAnon peak):")
    for peak in sorted(roles.values(), key=lambda p: -p.pss_kib):
        if peak.pss_kib * 1024 >= 0.02 * GB:
            print(f"  {peak.role:<16} PSS {peak.pss_kib * 1024 / GB:5.2f} GB (anon {peak.pss_anon_kib * 1024 / GB:5.2f}, "
                  f"file {peak.pss_file_kib * 1024 / GB:4.2f}, shmem {peak.pss_shmem_kib * 1024 / GB:4.2f}); "
                  f"VmHWM {peak.vmhwm_kib * 1024 / GB:5.2f} GB; RssAnon {peak.anon_kib * 1024 / GB:5.2f} GB")
    summed = sum(p.pss_kib for p in roles.values()) * 1024
    at_once = result.pss_sum_peak_kib * 1024
    print(f"  sum of the per-process PSS peaks {summed / GB:.2f} GB; peak of the summed PSS {at_once / GB:.2f} GB "
          f"= {at_once / state_bytes:.2f}x the state ({state_bytes / GB:.2f} GB; goal <= {MEMORY_GOAL}x = "
          f"{MEMORY_GOAL * state_bytes / GB:.2f} GB: {'MET' if at_once <= MEMORY_GOAL * state_bytes else 'NOT MET'}); "
          f"/dev/shm weight-sync folder peak {result.shm_peak / GB:.2f} GB (in no PSS unless mapped)")


def print_ratios(results: list[RunResult], steps: int) -> None:
    print(f"\nratios of the span steps 1..{steps} against `none`, per repetition (each rep's runs back to back):")
    by_rep: dict[int, dict[str, RunResult]] = {}
    for result in results:
        by_rep.setdefault(result.rep, {})[result.variant] = result
    for low in ("lowmem", "lowmem_gc"):
        pairs = [(runs["none"], runs[low]) for runs in by_rep.values() if "none" in runs and low in runs]
        if pairs:
            print(f"  {low} (the update's low-memory settings) against none (the recipe's), per rep: median step "
                  + ", ".join(f"{new.step_s_median or float('nan'):.2f} s against {old.step_s_median or float('nan'):.2f} s"
                              for old, new in pairs) + "; span "
                  + ", ".join(f"{new.span_s or float('nan'):.1f} s ({new.span_cpu_s or float('nan'):.0f} CPU s) against "
                              f"{old.span_s or float('nan'):.1f} s ({old.span_cpu_s or float('nan'):.0f} CPU s)" for old, new in pairs))
    for variant in [name for name in ("ckpt4", "eval") if any(name in runs for runs in by_rep.values())]:
        every, goal = GOAL_EVERY[variant], GOALS[variant]
        events = (steps - 1) // EVENT_EVERY  # events after steps 1..N-1, inside the span
        costs, cpu_costs, ratios, walls = [], [], [], []
        for runs in by_rep.values():
            base, other = runs.get("none"), runs.get(variant)
            if base is None or other is None or not base.span_s or not other.span_s or not events:
                continue
            extra = (other.span_s - base.span_s) / events
            costs.append(extra / (base.span_s / (steps - 1) * every))  # per event, over `every` of none's steps
            ratios.append(other.span_s / base.span_s)
            if base.span_cpu_s and other.span_cpu_s is not None:
                cpu_costs.append((other.span_cpu_s - base.span_cpu_s) / events / (base.span_cpu_s / (steps - 1) * every))
            walls.append(other.wall_s / base.wall_s)
        if not costs:
            print(f"  {variant}: no pair of completed runs")
            continue
        what = "checkpoint" if variant == "ckpt4" else "evaluation on 200 held-out problems"
        spread = f" (reps: {', '.join(f'{c:+.1%}' for c in costs)})" if len(costs) > 1 else ""
        median = statistics.median(costs)
        print(f"  {variant}: span {', '.join(f'{r:.3f}' for r in ratios)}x none's ({events} event(s) in {steps - 1} steps); "
              f"one {what} every {every} steps costs {median:+.1%} of the wall time{spread}; goal <= {goal:.0%}: "
              f"{'MET' if median <= goal else 'NOT MET'}; whole command {', '.join(f'{w:.3f}' for w in walls)}x none's")
        if cpu_costs:  # the work it adds, whatever the load: an upper bound of its wall cost when both cores are busy
            print(f"    in CPU seconds of the run's processes over the span: one {what} every {every} steps adds "
                  f"{statistics.median(cpu_costs):+.1%} of their CPU (reps: {', '.join(f'{c:+.1%}' for c in cpu_costs)})")


def parameter_count(config: Path, base: list[str]) -> int:
    """Parameters of the run's model, built as the trainer builds it (a GGUF file is converted
    to its HF folder first, once), in a child process: its memory is returned before the runs."""
    code = ("import sys; from rlpipe.core.config import load_config; from rlpipe.workers.builders import build_policy; "
            "model, _ = build_policy(load_config(sys.argv[1], sys.argv[2:])); print(sum(p.numel() for p in model.parameters()))")
    out = subprocess.run([sys.executable, "-c", code, str(config), *base], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    return int(out.stdout.split()[-1])


def run_plain(config: Path, base: list[str], work: Path, threads: int) -> RunResult:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, str(REPO / "benchmarks" / "plain_step.py"), str(config)]
    for override in base:
        command += ["--set", override]
    load_before = os.getloadavg()[0]
    log = work / "plain.log"
    returncode, wall_s, watch = run_watched(command, REPO, env, log, work / "no-shm-folder", pss=True, interval_s=0.2)
    tail = "\n".join(log.read_text().splitlines()[-6:])
    for peak in watch.peaks.values():
        peak.role = "plain process" if peak.pid == watch.root else peak.role
    return RunResult("plain", 0, returncode, wall_s, None, None, None, None, None, 0, 0, load_before,
                     os.getloadavg()[0], list(watch.peaks.values()), watch.pss_sum_peak_kib, 0, tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--steps", type=int, default=6, help="RL steps per run (>= 5: the span holds the event after step 4)")
    parser.add_argument("--reps", type=int, default=2, help="repetitions of the interleaved variants")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS), help="only these variants (default: all)")
    parser.add_argument("--no-plain", action="store_true", help="skip the one-process PyTorch reference")
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of the run's processes")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                        help="a config override for every variant, e.g. rollout.engine_dtype='\"bfloat16\"'")
    parser.add_argument("--keep", type=Path, help="keep the work folder (configs, logs; each lake is deleted once measured) here")
    args = parser.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="rlpipe-long-run-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.model == "smollm2":
        config = REPO / "configs" / "smollm2.toml"
        if not (REPO / "models" / "smollm2").is_dir():
            sys.exit("error: no models/smollm2/: run `make smollm2` first")
    else:
        config = work / "tiny.toml"
        config.write_text(TINY_TOML)
    base = [f"train.steps={args.steps}", *args.overrides]
    variants = args.variant or list(DEFAULT_VARIANTS)
    print(f"{args.model}: {config.name} --set {' --set '.join(base)}; variants {', '.join(variants)} x {args.reps}, "
          f"interleaved; OMP_NUM_THREADS={args.threads}; {os.cpu_count()} CPUs; load {os.getloadavg()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    count = parameter_count(config, base)
    weights = count * 4
    state = 5 * weights
    print(f"model: {count:,} parameters, fp32 weights {weights / GB:.2f} GB; the run's state (trainer: weights, "
          f"gradients, 2 AdamW moments; engine: weights) {state / GB:.2f} GB", flush=True)
    results = []
    try:
        for rep in range(1, args.reps + 1):
            for name in variants:
                results.append(run_variant(name, rep, config, base, work, args.threads))
                print_run(results[-1])
        if "none" in variants:
            print_ratios(results, args.steps)
        for name in variants:
            completed = [r for r in results if r.variant == name and r.returncode == 0]
            if completed:
                worst = max(completed, key=lambda r: r.pss_sum_peak_kib)
                print_memory(worst, state, f"{name} rep {worst.rep} (the rep with the largest summed peak)")
        if not args.no_plain:
            plain = run_plain(config, base, work, args.threads)
            print(f"\nplain PyTorch, one process: exit {plain.returncode}, {plain.wall_s:.0f} s, load "
                  f"{plain.load_before:.1f} -> {plain.load_after:.1f}\n  " + plain.tail.replace("\n", "\n  "))
            print_memory(plain, 4 * weights, "the plain process (its state: weights, gradients, 2 moments)")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
