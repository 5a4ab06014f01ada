"""Worker start-up: what getting both workers of a run ready costs, spawned vs forked from
the zygote (workers/launch.py), measured side by side.

    nice -n 19 .venv/bin/python benchmarks/worker_start.py [--rounds 3] [--config configs/quickstart.toml]

Each round runs, in a fresh Python process per launch mode (RLPIPE_WORKER_LAUNCH=spawn, then
zygote, interleaved), what a run's controller does: start the engine and the trainer worker
of the config, wait until both are ready (a call to each), then kill the engine with SIGKILL
and call it again (a restart), then close both (the zygote ends with them). Printed per
mode: the wall time to both ready and to the restarted engine ready, and the CPU seconds of
every process the controller started (workers, zygote; getrusage of reaped children, user +
system), with the median ratio zygote / spawn. Nothing asserts a time: numbers are for
reading, and they move with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

ONE_LAUNCH = """
import json, os, resource, signal, sys, tempfile, time
from pathlib import Path
from rlpipe.core.config import load_config
from rlpipe.workers.client import EngineClient, TrainerClient, WorkerSpec

folder = Path(sys.argv[2])
config = load_config(sys.argv[1], [f'storage.lake_uri="{folder / "lake"}"', f'tracking.mlflow_uri="sqlite:///{folder / "m.db"}"'])
sockets = Path(tempfile.mkdtemp(prefix="rlb-"))
(folder / "shm").mkdir()
spec = lambda kind: WorkerSpec("bench", kind, config.model_dump_json(), sockets, folder / "shm")
engine, trainer = EngineClient(spec("engine")), TrainerClient(spec("trainer"))
began = time.monotonic()
engine.start(); trainer.start()
engine.version(); trainer.digest()
ready = time.monotonic() - began
os.kill(engine.pid, signal.SIGKILL)
began = time.monotonic()
engine.version()
restart = time.monotonic() - began
engine.close(); trainer.close()
used = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"ready_s": ready, "restart_s": restart, "children_cpu_s": used.ru_utime + used.ru_stime}))
"""


def one(mode: str, config: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "RLPIPE_WORKER_LAUNCH": mode, "PYTHONPATH": str(REPO)}
        result = subprocess.run([sys.executable, "-c", ONE_LAUNCH, config, folder], capture_output=True, text=True,
                                env=env, cwd=REPO, timeout=900)
        if result.returncode != 0:
            raise SystemExit(f"{mode} round failed:\n{result.stderr[-3000:]}")
        return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart.toml"))
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"spawn": [], "zygote": []}
    for round_ in range(args.rounds):
        for mode in ("spawn", "zygote"):
            runs[mode].append(one(mode, args.config))
            print(f"round {round_ + 1} {mode:6s} {json.dumps(runs[mode][-1])}", flush=True)
    load = os.getloadavg()[0]
    print(f"\n{'':8s}{'both ready s':>14s}{'restart s':>12s}{'child CPU s':>13s}   (median of {args.rounds}; load {load:.1f})")
    medians = {mode: {key: statistics.median(run[key] for run in runs[mode]) for key in runs[mode][0]} for mode in runs}
    for mode, values in medians.items():
        print(f"{mode:8s}{values['ready_s']:14.2f}{values['restart_s']:12.2f}{values['children_cpu_s']:13.2f}")
    ratio = {key: medians["zygote"][key] / medians["spawn"][key] for key in medians["spawn"]}
    print(f"{'ratio':8s}{ratio['ready_s']:14.2f}{ratio['restart_s']:12.2f}{ratio['children_cpu_s']:13.2f}   zygote / spawn")
    print(f"(this process's own children, all rounds: {resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime:.1f} s user)")


if __name__ == "__main__":
    main()
