"""`rlpipe train` timed per RL step from outside, as a user runs it: benchmarks/vs_trl.py's
`--systems cli` (beside its library loop and TRL's GRPOTrainer).

`run_cli` runs the command in a subprocess on a model folder (no warm start: the race's
warm-started policy, saved once), with the race's settings as `--set` overrides, in a
temporary folder that holds its lake, its MLflow database and its RLPIPE_HOME (so no
`rlpipe up` services of the machine are used: Prefect runs its temporary server, as in a
fresh clone). Afterwards it reads from the lake:
  - each step's commit time (MANIFEST.json `committed_at_ms`). From one commit to the next
    is one whole step as the CLI runs it: the end of step-(k-1) (update, sync, track,
    status) then the start of step-k (sample, generate, verify, advantages, persist), with
    Prefect's task runs, the lake's writes and reads, MLflow and the workers' hand-offs included;
  - the per-stage seconds the flow recorded (TRAIN.json `time/*_s`, medians);
  - the held-out accuracy after RL (evals/after_rl.json, the run's own greedy evaluator).
CPU seconds: every process of the command's tree (controller, engine and trainer workers,
the Prefect server), sampled every 50 ms and interpolated at the first and last commit,
divided by the steps between them (one mean, not one figure per step).

Not here: the loop and TRL (benchmarks/vs_trl.py), anything inside the command.
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart.toml"


@dataclass
class StepTimes:
    """Seconds of each RL step after the first (wall; CPU per step, or its mean for the CLI),
    the CLI's stage medians, and the held-out accuracy where the system measured it."""

    wall: list[float]
    cpu: list[float]
    stages: dict[str, float] = field(default_factory=dict)
    accuracy: float = float("nan")

    def median(self) -> tuple[float, float]:
        return statistics.median(self.wall), statistics.median(self.cpu)


def run_cli(sets: list[str], steps: int, threads: int, checkout: Path = REPO, python: str | None = None) -> StepTimes:
    """`rlpipe train configs/quickstart.toml --set ...` for `steps` RL steps from `checkout`."""
    with tempfile.TemporaryDirectory(prefix="vs_trl_cli_") as folder:
        tmp = Path(folder)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "RLPIPE_HOME": str(tmp / "home"), "PYTHONPATH": str(checkout)}
        env.pop("PREFECT_API_URL", None)
        overrides = [*sets, f"train.steps={steps}", "warmstart.steps=0", f'storage.lake_uri="{tmp / "lake"}"',
                     f'tracking.mlflow_uri="sqlite:///{tmp / "mlflow.db"}"']
        command = [python or str(checkout / ".venv" / "bin" / "python"), "-m", "rlpipe.cli.main", "train", str(QUICKSTART)]
        command += [part for override in overrides for part in ("--set", override)]
        log = tmp / "cli.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(command, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT)
            cpu: list[tuple[float, float]] = []  # (epoch seconds, CPU seconds of the whole tree)
            while process.poll() is None:
                cpu.append((time.time(), _tree_cpu_s(process.pid)))
                time.sleep(0.05)
        if process.returncode != 0:
            raise RuntimeError(f"rlpipe train exited {process.returncode}:\n{log.read_text()[-3000:]}")
        return _read_run(tmp / "lake", cpu)


def _read_run(lake: Path, cpu: list[tuple[float, float]]) -> StepTimes:
    (run,) = (lake / "runs").iterdir()
    commits, stages = [], {}
    for folder in sorted((run / "steps").iterdir()):
        commits.append(json.loads((folder / "MANIFEST.json").read_text())["committed_at_ms"] / 1000)
        for name, value in json.loads((folder / "TRAIN.json").read_text())["metrics"]:
            if name.startswith("time/") and name != "time/step_s" and len(commits) > 1:
                stages.setdefault(name.removeprefix("time/").removesuffix("_s"), []).append(value)
    walls = [b - a for a, b in zip(commits, commits[1:])]
    cpu_per_step = (_interpolate(cpu, commits[-1]) - _interpolate(cpu, commits[0])) / len(walls)
    accuracy = json.loads((run / "evals" / "after_rl.json").read_text())["accuracy"]
    return StepTimes(walls, [cpu_per_step], {name: statistics.median(values) for name, values in stages.items()}, accuracy)


def _tree_cpu_s(pid: int) -> float:
    total = 0.0
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return float("nan")
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _interpolate(samples: list[tuple[float, float]], at: float) -> float:
    """The tree's CPU seconds at epoch time `at`, linear between the two samples around it."""
    index = min(max(bisect.bisect_left([t for t, _ in samples], at), 1), len(samples) - 1)
    (t0, c0), (t1, c1) = samples[index - 1], samples[index]
    return c0 + (c1 - c0) * (at - t0) / (t1 - t0) if t1 > t0 else c1
