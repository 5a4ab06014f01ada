"""Time per stage of an RL step, and Prefect's overhead measured side by side.

Runs RL steps two ways, interleaved (plain, tasks, plain, ...) in one process from the same
warm-started policy, so that a machine's changing load hits both alike:
  1. plain: the step's stages called directly (tasks/step_tasks.py `rollout_stages` and
     `train_stages`), no Prefect;
  2. tasks: `rl_step` as the train flow runs it: `step-N`, one task run of the run's flow run.
(Earlier layouts, a task run per stage, a nested flow run per step and two task runs per
step: their figures are in docs/RESULTS.md, "What orchestration costs".)
Prints seconds per stage (plain, from the step's StageClock) and the ratio tasks/plain,
i.e. what orchestration costs. Uses configs/quickstart.toml with fewer steps by default.
Prefect's API is the temporary server `rlpipe train` starts (orchestration/prefect_server.py; a
PREFECT_API_URL in the environment is used instead). On a loaded machine the wall-clock
ratios move by +-15 % from run to run, so it also prints the CPU seconds per step that
the controller (all its threads) spent in each mode (tasks - plain: what orchestration
costs the controller in CPU, whatever the load) and the Prefect server process's CPU in
the same intervals (the server handles a step's events a little after them, so some of
a tasks step's server CPU falls into the step that follows it), and the load average.
Then the peak resident memory (VmHWM) of the controller (this process) and of the run's
engine and trainer workers, each over the whole benchmark (warm-start included).
`--profile FILE`: the controller's cProfile over the steps run as tasks (saved to FILE, its
top entries printed), and the CPU seconds per step of each process (controller, engine and
trainer workers, Prefect server) over those steps: where a step's time goes outside the
library's own calls (benchmarks/vs_trl.py --steps times the whole CLI against the loop).
The profiler slows the controller: its tasks-mode wall and CPU figures are then not the
plain mode's equals, the workers' and the server's are.

    .venv/bin/python benchmarks/step_breakdown.py [--steps 6] [--config configs/quickstart.toml]
        [--set KEY=VALUE ...] [--profile FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
MODES = ("plain", "tasks")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/quickstart.toml")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--profile", help="cProfile the controller over the task steps into this file")
    args = parser.parse_args()

    from prefect import flow

    from rlpipe.core.config import load_config
    from rlpipe.flows.steps import rl_step
    from rlpipe.tasks import lifecycle, step_tasks
    from rlpipe.orchestration.prefect_server import temporary_prefect_server
    from rlpipe.controller.launch import build_runtime
    from rlpipe.controller.stage_clock import StageClock

    with tempfile.TemporaryDirectory() as lake:
        overrides = [f'storage.lake_uri="{lake}/lake"', f'tracking.mlflow_uri="sqlite:///{lake}/mlflow.db"']
        # one generation round per step in every mode: the same work in each step
        config = load_config(args.config, overrides + [f"train.steps={len(MODES) * args.steps}", "checkpoint.every_steps=100000",
                                                       "rollout.dynamic_sampling=false", *args.overrides])
        profile = cProfile.Profile() if args.profile else None

        @flow(name="step-breakdown")
        def bench() -> dict[str, list[float]]:
            run_id = f"bench-{os.getpid()}"  # /dev/shm/rlpipe-<run id>: two benchmarks at once must not share it
            runtime = build_runtime(run_id, config)
            try:
                return _steps(runtime)
            finally:
                workers = runtime.workers
                peaks.update(engine_worker=_peak_rss_mb(workers.engine.pid), trainer_worker=_peak_rss_mb(workers.trainer.pid))
                runtime.close()

        def _steps(runtime) -> dict[str, list[float]]:
            lifecycle.open_run(runtime)
            lifecycle.warm_start(runtime)
            workers = {runtime.workers.engine.pid, runtime.workers.trainer.pid}
            worker_pids = {"engine": runtime.workers.engine.pid, "trainer": runtime.workers.trainer.pid}
            stage_s: dict[str, list[float]] = defaultdict(list)
            step_s: dict[str, list[float]] = defaultdict(list)
            for step in range(1, len(MODES) * args.steps + 1):
                mode = MODES[(step - 1) % len(MODES)]
                cpu_before = _orchestration_cpu_s(workers)
                workers_before = {name: _cpu_s(pid) for name, pid in worker_pids.items()}
                started = time.perf_counter()
                if mode == "tasks":
                    if profile:
                        profile.enable()
                    rl_step(runtime, step)
                    if profile:
                        profile.disable()
                else:
                    _plain_step(runtime, step, stage_s)
                step_s[mode].append(time.perf_counter() - started)
                for name, pid in worker_pids.items():
                    cpu_s[f"{mode}_{name}"].append(_cpu_s(pid) - workers_before[name])
                load_1m.append(os.getloadavg()[0])
                for name, seconds in zip(("controller", "server"), _orchestration_cpu_s(workers)):
                    cpu_s[f"{mode}_{name}"].append(seconds - cpu_before[name == "server"])
            return {**stage_s, **{f"{mode}_step": values for mode, values in step_s.items()}}

        def _plain_step(runtime, step: int, stage_s: dict[str, list[float]]) -> None:
            clock = StageClock()
            step_tasks.rollout_stages(runtime, step, clock)
            step_tasks.train_stages(runtime, step, clock)
            clock.enter("done")  # close track's interval (the step's own timings end where track starts)
            for stage, seconds in clock.seconds.items():
                stage_s[stage].append(seconds)

        peaks: dict[str, float] = {}
        load_1m: list[float] = []
        cpu_s: dict[str, list[float]] = defaultdict(list)
        with temporary_prefect_server():  # as `rlpipe train` runs (90 s to start, not Prefect's 20 s)
            result = bench()
        peaks["controller"] = _peak_rss_mb(os.getpid())

    print(f"\nper-stage seconds, plain calls ({args.steps} steps, median):")
    for stage in ("sample", "generate", "verify", "advantages", "persist", "update", "sync", "track"):
        values = result[stage]
        print(f"  {stage:<11} {statistics.median(values):8.4f} s   (max {max(values):.4f})")
    plain = statistics.median(result["plain_step"])
    print(f"\nstep as plain calls             : {plain:.3f} s (median of {len(result['plain_step'])})")
    flowed = statistics.median(result["tasks_step"])
    print(f"step as 2 tasks of the run's flow: {flowed:.3f} s; overhead {flowed - plain:+.3f} s = {(flowed - plain) / plain:.1%}; "
          f"ratio tasks/plain {flowed / plain:.3f}")
    pairs = [tasks / plain_s for plain_s, tasks in zip(result["plain_step"], result["tasks_step"])]
    print(f"ratio of each step to the plain step before it: median {statistics.median(pairs):.3f}, "
          f"min {min(pairs):.3f}, max {max(pairs):.3f}")
    print(f"load average (1 min) during the steps: {min(load_1m):.1f}-{max(load_1m):.1f}, median {statistics.median(load_1m):.1f}")
    print("\nCPU seconds per step (mean: the clocks tick in 10 ms, so a median of single steps is one of a few values),")
    print("the controller (all its threads), the Prefect server process and the two workers:")
    mean = {key: statistics.fmean(values) for key, values in cpu_s.items()}
    for mode in MODES:
        extra = mean[f"{mode}_controller"] - mean["plain_controller"]
        print(f"  {mode:<6} controller {mean[f'{mode}_controller']:.3f} s ({extra:+.3f} s vs plain = {extra / plain:.1%} of a plain step), "
              f"server {mean[f'{mode}_server']:.3f} s, engine {mean[f'{mode}_engine']:.3f} s, trainer {mean[f'{mode}_trainer']:.3f} s")
    if profile:
        profile.dump_stats(args.profile)
        print(f"\nthe controller's profile over the {args.steps} task steps ({args.profile}), by cumulative time:")
        pstats.Stats(args.profile).sort_stats("cumulative").print_stats(r"rlpipe/|prefect/(tasks|artifacts)|mlflow/tracking/client|fsync", 40)
    print("\npeak resident memory (VmHWM), MB:")
    for name, megabytes in peaks.items():
        print(f"  {name:<15} {megabytes:8.1f}")


def _orchestration_cpu_s(workers: set[int]) -> tuple[float, float]:
    """CPU seconds so far of this process (every thread: the flow's, Prefect's event and log
    workers), and of its other children (the temporary Prefect server), not the workers."""
    import psutil

    times = os.times()
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        if child.pid in workers:
            continue
        try:
            child_times = child.cpu_times()
        except psutil.Error:
            continue
        total += child_times.user + child_times.system
    return times.user + times.system, total


def _cpu_s(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _peak_rss_mb(pid: int | None) -> float:
    """VmHWM of a live process, in MB (nan when it is gone)."""
    if pid is None:
        return float("nan")
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


if __name__ == "__main__":
    main()
