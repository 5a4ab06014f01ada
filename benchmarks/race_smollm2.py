"""The race on the real model (issue 33 item 2): `rlpipe train` against TRL's GRPOTrainer on
SmolLM2-135M-Instruct, the same weights, prompts, reward and settings, per seed.

    nice -n 19 .venv/bin/python benchmarks/race_smollm2.py [--minutes 30] [--seeds 0,1,2]
        [--rlpipe-steps N] [--eval-every K] [--heldout-size H] [--threads T] [--config configs/smollm2_math.toml] [--set KEY=VALUE]
    (needs the `bench` extra, i.e. trl, and `make smollm2`)

Per seed, the two sides one after the other, the order alternating by the seed's parity
(even seeds: rlpipe then TRL; odd: TRL then rlpipe), each a subprocess whose process tree is
polled every 1 s for its summed PSS (benchmarks/process_peaks.py; the peak of the sum at one poll):
- rlpipe: `rlpipe train CONFIG --set seed=S ...` as a user runs it (its temporary Prefect
  server, a private lake, MLflow sqlite store and RLPIPE_HOME), the recipe as shipped
  (checkpoints included) but for `--set`s; its held-out evaluations (before RL, every
  eval.every_steps) and its steps are read from the lake: evals/*.json, and each step's
  TRAIN.json, whose write ends the step (an evaluation runs from step k's TRAIN.json to
  evals/step_k.json; file times);
- TRL: benchmarks/race_trl_side.py (its docstring: what is the same and what differs),
  evaluated by rlpipe's evaluator on the same held-out tasks at the same steps.
Clocks: each side's curve is in TRAINING seconds from its first RL step, every evaluation's
time taken out (the CLI's subtracted from its file times, TRL's clock stopped while it
evaluates); "startup" (launch to the first RL step: imports, model load, workers, the
Prefect server, and the same evaluation before RL on both sides) is printed apart and
added back for the "command clock" comparison. Budget: each side stops at its first
evaluation at or past `--minutes` of training (rlpipe by SIGTERM after that evaluation is
stored, or with `--rlpipe-steps N` at the end of N steps).

Prints per seed and side: exit code, startup, RL steps, median seconds per RL step (after the
first), peak summed PSS, load average, and the held-out curve (overall and per domain,
strict / format-free); then, per metric (overall strict, overall format-free), the goal's
two comparisons (benchmarks/race_curves.py): rlpipe's time to reach TRL's final accuracy as
a fraction of TRL's time, and rlpipe's largest deficit at equal training time with its
binomial standard error. Asserts nothing; measurements go to docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from process_peaks import Watch  # noqa: E402
from race_curves import Point, largest_deficit, time_to_reach  # noqa: E402

from rlpipe.workers.shm import folder_prefix, shm_base  # noqa: E402 - torch-free

GB = 1e9
HEADLINES = ("accuracy", "format_free")  # overall strict, overall format-free


@dataclass
class Side:
    """One side's run: its curve per metric (Points in training seconds), step times, memory."""

    name: str
    seed: int
    returncode: int = 0
    wall_s: float = 0.0
    startup_s: float = float("nan")
    step_ends_s: list[float] = field(default_factory=list)
    evaluations: list[tuple[int, float, dict[str, float]]] = field(default_factory=list)  # (step, training s, figures)
    pss_peak_kib: int = 0
    load: tuple[float, float] = (0.0, 0.0)
    tail: str = ""

    def curve(self, metric: str, offset: float = 0.0) -> list[Point]:
        """`metric`'s points (accuracy, format_free or e.g. accuracy/rg_chain_sum), shifted by `offset` s."""
        points = []
        for _, seconds, figures in self.evaluations:
            domains = [key.removeprefix("n/") for key in figures if key.startswith("n/")]
            kind, _, domain = metric.partition("/")
            count = figures.get(f"n/{domain}") if domain else sum(figures[f"n/{d}"] for d in domains if f"{kind}/{d}" in figures)
            if metric in figures and count:
                points.append(Point(seconds + offset, figures[metric], int(count)))
        return points

    def step_seconds(self) -> list[float]:
        """Each RL step's training seconds, after the first (which warms caches up)."""
        return [b - a for a, b in zip(self.step_ends_s[1:], self.step_ends_s[2:])]


def side_env(folder: Path, threads: int) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_API", "RLPIPE_FAILPOINTS"))}
    env |= {"OMP_NUM_THREADS": str(threads)} if threads else {}
    return env | {"PYTHONPATH": str(REPO), "PREFECT_HOME": str(folder / "prefect-home"), "RLPIPE_HOME": str(folder / "rlpipe-home"),
                  "PREFECT_LOGGING_LEVEL": "WARNING"}


def watched(side: Side, command: list[str], folder: Path, shm_prefix: Path, threads: int, should_stop=None) -> float:
    """Run `command` while a Watch polls its tree's PSS; SIGTERM it once `should_stop()` is
    true. Fills the side's exit code, wall time, PSS peak, load and log tail; returns the
    epoch second it was launched."""
    log = folder / f"{side.name}.log"
    side.load = (os.getloadavg()[0], 0.0)
    launched = time.time()
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=REPO, env=side_env(folder, threads), stdout=out, stderr=subprocess.STDOUT)
        watch = Watch(process.pid, shm_prefix, pss=True, interval_s=1.0)
        thread = threading.Thread(target=watch.run, daemon=True)
        thread.start()
        stopping = False
        while process.poll() is None:
            if not stopping and should_stop is not None and should_stop():
                process.send_signal(signal.SIGTERM)  # the CLI's orderly path: exit 143 (cli/signals.py)
                stopping = True
            time.sleep(1.0)
        watch.stop.set()
        thread.join()
    side.returncode, side.wall_s, side.pss_peak_kib = process.returncode, time.time() - launched, watch.pss_sum_peak_kib
    side.load = (side.load[0], os.getloadavg()[0])
    side.tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
    return launched


def read_cli_run(side: Side, run: Path, launched: float) -> None:
    """The CLI's steps and evaluations from its lake (see the module docstring), in training seconds."""
    before = run / "evals" / "before_rl.json"
    if not before.exists():
        return
    start = before.stat().st_mtime
    ends = {}
    for folder in sorted((run / "steps").glob("[0-9]*")):
        if (folder / "TRAIN.json").exists():
            ends[int(folder.name)] = (folder / "TRAIN.json").stat().st_mtime
    evaluations = []  # (step, started, ended, figures)
    for path in (run / "evals").glob("*.json"):
        if path.name == "before_rl.json":
            continue
        document = json.loads(path.read_text())
        step = int(document.pop("policy_version"))
        if step in ends:
            evaluations.append((step, ends[step], path.stat().st_mtime, document))
    evaluations.sort(key=lambda e: e[0])

    def training_s(moment: float) -> float:
        return moment - start - sum(end - begin for _, begin, end, _ in evaluations if end <= moment)

    figures = json.loads(before.read_text())
    figures.pop("policy_version", None)
    side.startup_s = start - launched
    side.evaluations = [(0, 0.0, figures)] + [(step, training_s(begin), doc) for step, begin, _, doc in evaluations]
    side.step_ends_s = [0.0] + [training_s(ends[step]) for step in sorted(ends)]


def run_rlpipe(seed: int, args: argparse.Namespace, sets: list[str], work: Path) -> Side:
    side, run_id = Side("rlpipe", seed), f"race-s{seed}"
    folder = work / f"rlpipe-s{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    lake = folder / "lake"
    overrides = [*sets, f"train.steps={args.rlpipe_steps or 100_000}", f'storage.lake_uri="{lake}"',
                 f'tracking.mlflow_uri="sqlite:///{folder / "mlflow.db"}"']
    command = [sys.executable, "-m", "rlpipe.cli.main", "train", str(args.config), "--run-id", run_id]
    command += [part for override in overrides for part in ("--set", override)]
    launched = time.time()

    def budget_spent() -> bool:  # the newest stored evaluation began at or past the budget
        if args.rlpipe_steps:
            return False
        read_cli_run(side, lake / "runs" / run_id, launched)
        return len(side.evaluations) > 1 and side.evaluations[-1][1] >= args.minutes * 60

    launched = watched(side, command, folder, shm_base() / folder_prefix(run_id), args.threads, budget_spent)
    read_cli_run(side, lake / "runs" / run_id, launched)
    if side.returncode == 143 and not args.rlpipe_steps:
        side.returncode = 0  # stopped by the race at its budget
    return side


def run_trl(seed: int, args: argparse.Namespace, sets: list[str], work: Path) -> Side:
    side = Side("trl", seed)
    folder = work / f"trl-s{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "result.json"
    command = [sys.executable, str(REPO / "benchmarks" / "race_trl_side.py"), str(args.config), "--out", str(out),
               "--budget-s", str(args.minutes * 60)]
    command += [part for override in sets for part in ("--set", override)]
    launched = watched(side, command, folder, folder / "no-shm-folder", args.threads)
    if out.exists():
        result = json.loads(out.read_text())
        side.startup_s = result.get("train_started_at", float("nan")) - launched
        side.evaluations = [(e["step"], e["train_s"], e["figures"]) for e in result["evaluations"]]
        side.step_ends_s = [0.0, *result["step_ends_s"]]
        if result.get("steps_off_rlpipe_prompts"):
            side.tail = f"{result['steps_off_rlpipe_prompts']} RL steps trained on other prompts than rlpipe's\n" + side.tail
            side.returncode = side.returncode or 1
    return side


def print_side(side: Side) -> None:
    steps = side.step_seconds()
    per_step = (f"{statistics.median(steps):.2f} s ({min(steps):.2f}-{max(steps):.2f})" if steps else "n/a")
    print(f"seed {side.seed} {side.name}: exit {side.returncode}, wall {side.wall_s:.0f} s, startup {side.startup_s:.0f} s, "
          f"{len(side.step_ends_s) - 1} RL steps, {per_step} per RL step (median after the first, training clock), "
          f"peak summed PSS {side.pss_peak_kib * 1024 / GB:.2f} GB, load {side.load[0]:.1f} -> {side.load[1]:.1f}", flush=True)
    for step, seconds, figures in side.evaluations:
        domains = sorted(key.removeprefix("n/") for key in figures if key.startswith("n/"))
        each = "; ".join(f"{d.removeprefix('rg_')} {figures[f'accuracy/{d}']:.3f}/{figures.get(f'format_free/{d}', float('nan')):.3f}"
                         for d in domains)
        print(f"  step {step:>4} at {seconds:7.0f} s: strict {figures['accuracy']:.3f}, format-free "
              f"{figures.get('format_free', float('nan')):.3f} ({each}; strict/format-free, n = "
              f"{int(figures[f'n/{domains[0]}'])} each)", flush=True)
    if side.returncode:
        print("  last lines:\n    " + side.tail.replace("\n", "\n    "), flush=True)


def compare(rlpipe: Side, trl: Side, metric: str, command_clock: bool) -> tuple[float | None, float | None]:
    """Print the goal's two comparisons on `metric`; return (fraction of TRL's time, deficit in SEs)."""
    ours = rlpipe.curve(metric, rlpipe.startup_s if command_clock else 0.0)
    theirs = trl.curve(metric, trl.startup_s if command_clock else 0.0)
    clock = "command clock (startup included)" if command_clock else "training clock"
    if len(theirs) < 2 or not ours:
        print(f"  {metric}, {clock}: not enough evaluations to compare")
        return None, None
    final = theirs[-1]
    reached = time_to_reach(ours, final.accuracy)
    fraction = reached / final.seconds if reached is not None and final.seconds > 0 else None
    deficit = largest_deficit(ours, theirs)
    print(f"  {metric}, {clock}: TRL's final {final.accuracy:.3f} at {final.seconds:.0f} s; rlpipe reaches it "
          + (f"at {reached:.0f} s = {fraction:.2f}x TRL's time" if fraction is not None else "never (in its run)")
          + f"; rlpipe's largest deficit at equal time {100 * deficit.behind:+.1f} points at {deficit.seconds:.0f} s "
          f"(SE {100 * deficit.standard_error:.1f}, {deficit.in_errors:.1f} SE)", flush=True)
    return fraction, deficit.in_errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "smollm2_math.toml")
    parser.add_argument("--minutes", type=float, default=30.0, help="training minutes per side (evaluations excluded)")
    parser.add_argument("--rlpipe-steps", type=int, default=0, help="> 0: rlpipe runs this many steps instead of --minutes")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds")
    parser.add_argument("--eval-every", type=int, help="RL steps between evaluations (default: the recipe's eval.every_steps)")
    parser.add_argument("--heldout-size", type=int, help="held-out problems per domain (default: the recipe's; smoke runs: fewer)")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE", help="for both sides")
    parser.add_argument("--threads", type=int, default=0, help="> 0: OMP_NUM_THREADS of both sides' processes (else their defaults)")
    parser.add_argument("--keep", type=Path, help="keep the work folder (logs, lakes) here")
    args = parser.parse_args()
    if not (REPO / "models" / "smollm2").is_dir() and "smollm2" in args.config.name:
        sys.exit("error: no models/smollm2/: run `make smollm2` first")
    work = Path(args.keep or tempfile.mkdtemp(prefix="race-smollm2-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    common = [*(["eval.every_steps=%d" % args.eval_every] if args.eval_every else []),
              *(["envs.heldout_size=%d" % args.heldout_size] if args.heldout_size else []), *args.overrides]
    seeds = [int(seed) for seed in args.seeds.split(",")]
    print(f"race on {args.config.name}: seeds {seeds}, {args.minutes:g} training minutes per side"
          f"{f' (rlpipe: {args.rlpipe_steps} steps)' if args.rlpipe_steps else ''}; --set {' '.join(common) or '(none)'}; "
          f"OMP_NUM_THREADS {args.threads or 'unset'}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    summary: dict[tuple[str, bool], list[tuple[float | None, float | None]]] = {}
    try:
        for seed in seeds:
            sets = [f"seed={seed}", *common]
            # by the seed's parity, not its place in --seeds: seeds raced one command at a time
            # (--seeds 0, then --seeds 1) keep the alternation
            order = (run_rlpipe, run_trl) if seed % 2 == 0 else (run_trl, run_rlpipe)
            sides = {}
            for run in order:
                side = run(seed, args, sets, work)
                sides[side.name] = side
                print_side(side)
                if not args.keep:
                    shutil.rmtree(work / f"{side.name}-s{seed}" / "lake", ignore_errors=True)
            print(f"seed {seed}: rlpipe against TRL")
            for metric in HEADLINES:
                for command_clock in (False, True):
                    summary.setdefault((metric, command_clock), []).append(compare(sides["rlpipe"], sides["trl"], metric, command_clock))
        print("\nover the seeds (goal: fraction <= 0.5; never behind beyond noise, i.e. every deficit < 2 SE):")
        for (metric, command_clock), values in summary.items():
            fractions = [f"{f:.2f}" if f is not None else "never" for f, _ in values]
            deficits = [f"{d:.1f}" if d is not None else "n/a" for _, d in values]
            print(f"  {metric}, {'command' if command_clock else 'training'} clock: time to TRL's final as a fraction of TRL's "
                  f"{', '.join(fractions)}; largest deficit in SE {', '.join(deficits)}")
        print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
