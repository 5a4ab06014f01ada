"""Step time of the quickstart with the rollout engine local vs as a Ray actor, one after the other.

    .venv-ray/bin/python benchmarks/engine_on_ray.py [--address HOST:PORT] [--steps N] [--warmstart-steps W] [--cpus C]
                                                     [--ray-first]

Both runs are configs/quickstart.toml (128 prompts x 8 samples a step) with the warm start cut
to W supervised steps (the step time does not depend on how well the policy answers much: the
answers are at most 6 tokens) and N RL steps, in fresh lakes; the only difference is
`cluster.engine_on_ray` (the trainer worker is local in both). The engine actor reserves C CPUs
(default 2, the local worker's torch threads on this 2-core machine).

Without --address it starts a throw-away 2-node cluster on this machine (a head of 2 CPUs,
a node of 1: tests/helpers/ray_cluster.py) and stops it at the end; the actor then sits on
the head, sharing the cores with the trainer as the local worker does, so the difference is
the transport (actor calls, weights through the object store), not more hardware.

Prints, per run, the median and range over the steps of time/step_s, time/generate_s and
sync/seconds (step_metric_values), the first step excluded (it pays the engine's first
generate), and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")  # a loaded machine starts it slowly

from rlpipe.controller.builders import build_lake  # noqa: E402
from rlpipe.core.config import load_config  # noqa: E402
from rlpipe.flows.train import train  # noqa: E402
from rlpipe.storage.query import query_trajectories  # noqa: E402

METRICS = ("time/step_s", "time/generate_s", "sync/seconds")


def run(folder: Path, steps: int, warmstart_steps: int, extra: list[str]) -> tuple[dict[str, list[float]], float]:
    """Per-step values of METRICS (first step excluded) and the wall time of the whole run."""
    overrides = [f'storage.lake_uri="{folder / "lake"}"', f'tracking.mlflow_uri="sqlite:///{folder / "mlflow.db"}"',
                 f"train.steps={steps}", f"warmstart.steps={warmstart_steps}", "envs.heldout_size=200", *extra]
    config = load_config(Path("configs/quickstart.toml"), overrides)
    started = time.perf_counter()
    train(config, f"bench-{folder.name}")
    wall = time.perf_counter() - started
    rows = query_trajectories(build_lake(config), "select step, name, value from step_metric_values order by step").rows
    first = min(step for step, _, _ in rows)
    return {name: [value for step, metric, value in rows if metric == name and step != first] for name in METRICS}, wall


def describe(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", help="a running Ray cluster (default: a throw-away one on this machine)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmstart-steps", type=int, default=10)
    parser.add_argument("--cpus", type=float, default=2.0)
    parser.add_argument("--ray-first", action="store_true", help="run the engine-on-Ray run first (load drifts)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        address = args.address
        if address is None:
            from tests.helpers.ray_cluster import local_ray_cluster

            address = stack.enter_context(local_ray_cluster((2, 1))).address
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-ray-engine-")))
        results = {}
        runs = [("local", []), ("ray", [f'cluster.ray_address="{address}"', "cluster.engine_on_ray=true",
                                         f"cluster.ray_engine_cpus={args.cpus}"])]
        for label, extra in runs[::-1] if args.ray_first else runs:
            (root / label).mkdir()
            results[label] = run(root / label, args.steps, args.warmstart_steps, extra)
    print(f"quickstart, {args.steps} steps (first excluded), warm start {args.warmstart_steps} steps, "
          f"engine actor {args.cpus:g} CPUs")
    for label, (values, wall) in results.items():
        print(f"{label:>6}: " + "  ".join(f"{name} {describe(values[name])}" for name in METRICS) + f"  run {wall:.1f} s")
    local, ray = (results[label][0]["time/step_s"] for label in ("local", "ray"))
    if local and ray:
        print(f"step time ray/local: {statistics.median(ray) / statistics.median(local):.2f}x")


if __name__ == "__main__":
    main()
