"""Sync vs async on the same work: the train flow with rollout.max_staleness = 0 and = 1.

    .venv/bin/python benchmarks/async.py [--workload quickstart|code|both] [--steps 12] [--repeats 2] [--vary-seed]
                                         [--curve EVERY [--async-steps N]]

Each run is the real train flow (Prefect tasks, workers, lake, MLflow) in this process,
from the same seed with one torch thread per worker (OMP_NUM_THREADS=1 unless set), so
both modes start from the same warm-started policy bit for bit and each worker has one
core: the sync mode leaves one core idle while a stage runs, the async one overlaps
the engine and the trainer. (With torch's default threads the warm starts differ, and on
a loaded machine two 2-thread workers thrash.) What is
compared is the RL loop's wall time: the sum over steps of `time/step_s` (the flow
thread's time per step: in async mode it waits for the rollout lane only when the lane is
behind), and the held-out accuracy after RL. The modes alternate (sync, async, sync, ...)
so that a machine's changing load hits both alike. Nothing asserts: numbers are for reading.

--curve EVERY: held-out accuracy against the RL loop's wall time. Each run checkpoints every
EVERY steps (inside the timed step, in both modes); after the run, off the clock, each
checkpoint's policy is exported from the lake and evaluated greedily on the same held-out
tasks (tests/durability/eval_checkpoint.py, the train flow's measure). Evaluating inside the
run instead would drain the async lane at each evaluation and hand it free time. Printed:
each checkpoint's (loop seconds, accuracy), and per repeat the async policy's accuracy at the
sync run's final wall time (the last async checkpoint reached by then) beside sync's final one,
and at equal steps. --async-steps lets the async runs go on past --steps so that their curve
covers the sync run's wall time (the learning rate is constant, and the first --steps steps
of a longer async run are those of a shorter one).

Workloads:
  quickstart  configs/quickstart.toml (generation and the update about equal on 2 cores)
  code        HumanEval in bubblewrap sandboxes with the tiny model (verification of 2 x 8
              completions per step dominates; the model learns nothing here: accuracy is 0)
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # both modes: one thread per worker, the same warm start bit for bit
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")  # a loaded machine starts it slowly

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.toml"
WORKLOADS: dict[str, tuple[Path | None, list[str]]] = {
    "quickstart": (QUICKSTART, ["checkpoint.every_steps=1000"]),
    "code": (None, ["envs.domains={code = 1.0}", 'sandbox.backend="bwrap"', "sandbox.timeout_s=5.0", "sandbox.pool_size=4",
                    "rollout.prompts_per_step=2", "rollout.group_size=8", "rollout.max_new_tokens=16",
                    "warmstart.steps=1", "warmstart.batch_size=2", "envs.heldout_size=4",
                    "model.max_position_embeddings=2048", "checkpoint.every_steps=1000"]),
}


@dataclass(frozen=True)
class RunResult:
    loop_s: float  # the RL loop's wall time: the sum of time/step_s
    before: float  # held-out accuracy before RL and after it (the flow's own evaluations)
    after: float
    curve: tuple[tuple[int, float, float], ...]  # (step, loop seconds up to it, held-out accuracy) per checkpoint


def one_run(workload: str, staleness: int, steps: int, folder: Path, seed: int | None, curve_every: int,
            compared_steps: int) -> RunResult:
    """One train flow run of `steps` steps, and with curve_every its checkpoints evaluated off
    the clock; loop_s covers the first `compared_steps` steps."""
    from rlpipe.core.config import load_config
    from rlpipe.flows.train import train
    from rlpipe.controller.builders import build_lake
    from rlpipe.workers.policy_export import export_policy
    from tests.durability.eval_checkpoint import heldout_accuracy

    path, overrides = WORKLOADS[workload]
    where = [f'storage.lake_uri="{folder / "lake"}"', f'tracking.mlflow_uri="sqlite:///{folder / "mlflow.db"}"']
    seeded = [] if seed is None else [f"seed={seed}"]
    checkpoints = [f"checkpoint.every_steps={curve_every}"] if curve_every else []
    config = load_config(path, overrides + where + seeded + checkpoints
                         + [f"train.steps={steps}", f"rollout.max_staleness={staleness}"])
    summary = train(config, "bench")
    lake = build_lake(config)
    elapsed = list(itertools.accumulate(dict(lake.read_train_metrics("bench", step).metrics)["time/step_s"]
                                        for step in range(1, steps + 1)))
    points = []
    for step in lake.checkpoint_steps("bench") if curve_every else []:
        exported = export_policy(lake, "bench", folder / f"policy-{step}", step)
        points.append((step, elapsed[step - 1] if step else 0.0, heldout_accuracy(exported.folder, config)["accuracy"]))
    return RunResult(elapsed[compared_steps - 1], summary.accuracy_before_rl, summary.accuracy_after_rl, tuple(points))


def accuracy_by(curve: tuple[tuple[int, float, float], ...], seconds: float) -> tuple[int, float]:
    """(step, accuracy) of the last checkpoint reached within `seconds` of the RL loop."""
    return [(step, accuracy) for step, at, accuracy in curve if at <= seconds][-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["quickstart", "code", "both"], default="both")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--curve", type=int, default=0, metavar="EVERY",
                        help="checkpoint every EVERY steps and print held-out accuracy against wall time (see above)")
    parser.add_argument("--async-steps", type=int, default=None, metavar="N",
                        help="RL steps of the async runs (default --steps); the ratio compares the first --steps")
    parser.add_argument("--vary-seed", action="store_true",
                        help="repeat r runs both modes with seed r (the spread of accuracy across seeds), not the config's seed")
    args = parser.parse_args()
    workloads = ["quickstart", "code"] if args.workload == "both" else [args.workload]
    print(f"load average {os.getloadavg()[0]:.1f} at start; {args.steps} RL steps per run")
    print(f"{'workload':10} {'mode':5} {'repeat':>6} {'loop s':>8} {'s/step':>7} {'before':>7} {'after':>7} {'load':>5}", flush=True)
    for workload in workloads:
        seconds: dict[int, list[float]] = {0: [], 1: []}
        after: dict[int, list[float]] = {0: [], 1: []}
        curves: dict[int, list[RunResult]] = {0: [], 1: []}
        for repeat in range(args.repeats):
            for staleness in (0, 1) if repeat % 2 == 0 else (1, 0):
                with tempfile.TemporaryDirectory() as folder:
                    started = time.perf_counter()
                    steps = args.steps if staleness == 0 or args.async_steps is None else args.async_steps
                    result = one_run(workload, staleness, steps, Path(folder), repeat if args.vary_seed else None, args.curve,
                                     args.steps)
                loop, before, accuracy = result.loop_s, result.before, result.after
                seconds[staleness].append(loop)
                after[staleness].append(accuracy)
                curves[staleness].append(result)
                mode = "async" if staleness else "sync"
                print(f"{workload:10} {mode:5} {repeat:>6} {loop:>8.1f} {loop / args.steps:>7.2f} {before:>7.3f} {accuracy:>7.3f} "
                      f"{os.getloadavg()[0]:>5.1f}   (run {time.perf_counter() - started:.0f} s)", flush=True)
                if result.curve:
                    print("           curve (step, loop s, held-out): "
                          + "  ".join(f"{step} {at:.1f} {acc:.3f}" for step, at, acc in result.curve), flush=True)
        sync, asynchronous = statistics.median(seconds[0]), statistics.median(seconds[1])
        print(f"{workload}: RL loop sync {sync:.1f} s (runs {min(seconds[0]):.1f}..{max(seconds[0]):.1f}), "
              f"async {asynchronous:.1f} s (runs {min(seconds[1]):.1f}..{max(seconds[1]):.1f}): "
              f"async is {sync / asynchronous:.2f}x faster over {args.steps} steps; held-out after RL "
              f"sync {statistics.mean(after[0]):.3f}, async {statistics.mean(after[1]):.3f} "
              f"(after {args.steps} and {args.async_steps or args.steps} steps)", flush=True)
        for repeat, (sync_run, async_run) in enumerate(zip(curves[0], curves[1])):
            if sync_run.curve and async_run.curve:
                step, accuracy = accuracy_by(async_run.curve, sync_run.loop_s)
                final = sync_run.curve[-1]
                same_step = dict((s, a) for s, _, a in async_run.curve).get(final[0])
                print(f"{workload} repeat {repeat}: sync's final (step {final[0]}, {final[1]:.1f} s): {final[2]:.3f}; async at that "
                      f"wall time (step {step}): {accuracy:.3f} ({accuracy - final[2]:+.3f}); async at that step: "
                      + ("-" if same_step is None else f"{same_step:.3f} ({same_step - final[2]:+.3f})"), flush=True)


if __name__ == "__main__":
    main()
