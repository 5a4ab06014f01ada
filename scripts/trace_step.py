"""Print the rlpipe files whose code runs during one synchronous RL step, in the controller
and in the workers, so that docs/ARCHITECTURE.md's "one step, file by file" can be checked.

What it does: runs `rlpipe train` for one RL step on a tiny config (the default arithmetic
domain, 3 warm-start steps of 8 examples, 4 held-out tasks, groups of 2; a lake and an MLflow
store in a temporary folder) with scripts/step_trace/ on PYTHONPATH, whose sitecustomize.py
records, in every process of the run (CLI/controller, zygote, engine and trainer workers),
the rlpipe files whose functions are called: during the whole command, and while the
controller is inside `flows/steps.py` `rl_step` (one step: rollout -> update -> sync ->
track). Then prints the step's files, grouped by package, with a count, and the files the
rest of the command ran (start-up, warm start, evaluations, checkpoints) apart.

coverage is not installed in the project's venv, so this uses sys.settrace (call events
only); the set of files is what coverage would list as having executed lines, except files
whose code runs only at import (module bodies: constants, dataclass definitions), which
count here only when one of their functions is called. Takes about a minute on 2 cores.

    python scripts/trace_step.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY = ["warmstart.steps=3", "warmstart.batch_size=8", "envs.heldout_size=4", "rollout.group_size=2",
        "rollout.prompts_per_step=8", "train.steps=1", "checkpoint.every_steps=1000", "eval.every_steps=0"]


def run_traced(work: Path) -> Path:
    """Run one RL step under the tracer; the folder of per-process records."""
    records = work / "trace"
    records.mkdir()
    env = dict(os.environ, RLPIPE_STEP_TRACE=str(records),
               PYTHONPATH=os.pathsep.join([str(REPO / "scripts" / "step_trace"), str(REPO), os.environ.get("PYTHONPATH", "")]))
    overrides = TINY + [f'storage.lake_uri="{work / "lake"}"', f'tracking.mlflow_uri="sqlite:///{work / "mlflow.db"}"']
    command = [sys.executable, "-m", "rlpipe.cli.main", "train", "--run-id", "trace-step"]
    for override in overrides:
        command += ["--set", override]
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        sys.exit(f"rlpipe train failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return records


def read_records(records: Path) -> tuple[set[str], set[str]]:
    """(files called during the step, files called at all), over every process."""
    step, every = set(), set()
    for record in records.glob("*.txt"):
        for line in record.read_text().splitlines():
            kind, path = line.split(" ", 1)
            (step if kind == "step" else every).add(path)
    return step, every | step


def print_grouped(title: str, files: set[str]) -> None:
    print(f"{title}: {len(files)} files")
    by_package: dict[str, list[str]] = defaultdict(list)
    for path in sorted(files):
        parts = path.split("/")
        by_package["/".join(parts[:2]) if len(parts) > 2 else parts[0]].append(path)
    for package, paths in sorted(by_package.items()):
        print(f"  {package}/ ({len(paths)})")
        for path in paths:
            print(f"    {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it (default: a temporary one)")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        records = run_traced(args.keep)
        step, every = read_records(records)
    else:
        with tempfile.TemporaryDirectory(prefix="rlpipe-trace-") as work:
            step, every = read_records(run_traced(Path(work)))
    print_grouped("rlpipe files with code run during one RL step (controller and workers)", step)
    print()
    print_grouped("and only outside the step (start-up, warm start, evaluations, final checkpoint, end)", every - step)


if __name__ == "__main__":
    main()
