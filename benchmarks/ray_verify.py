"""Code-verification throughput on a Ray cluster beside the local sandbox pool, in one run.

    .venv-ray/bin/python benchmarks/ray_verify.py [--address HOST:PORT] [--samples N] [--pool-size S] [--rounds R]

Samples: the canonical solutions of the first N HumanEval problems (default all 164), run by
`verify_batch` (the verify stage's fan-out) on bubblewrap sandboxes, three ways on the same
pairs: the local SandboxPool of S sandboxes; RaySandboxPool with 1 worker; with 2 workers
(each worker an actor owning a pool of S sandboxes, so 2 workers hold 2S). Every pool is
built and warmed (one small batch) before its clock starts; the time is the best of R rounds.

Without --address it starts a throw-away 2-node cluster on this machine (a head of 2 CPUs,
a node of 1: tests/helpers/ray_cluster.py) and stops it at the end. On one host the Ray
rows show the cost of the fan-out (object store, actor calls) more than a gain: the
sandboxes share the same cores. Prints verifications per second for each and the ratio to
the local pool, and whether each gave the local pool's verdicts (duration aside).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlpipe.controller.launch import build_sandbox_pool  # noqa: E402
from rlpipe.controller.sample import build_mixture
from rlpipe.controller.verify_batch import verify_batch  # noqa: E402
from rlpipe.core.config import load_config  # noqa: E402

TIMEOUT_S = 3.0  # per verification, as benchmarks/code_verify.py


def measure(pool, mixture, pairs, rounds: int) -> tuple[float, list]:
    """(best seconds of `rounds` runs of verify_batch over `pairs`, the last run's verdicts)."""
    verify_batch(mixture, pool, pairs[:2])  # warm: ships the verify function, first sandbox uses
    best, verdicts = float("inf"), []
    for _ in range(rounds):
        started = time.perf_counter()
        verdicts = verify_batch(mixture, pool, pairs)
        best = min(best, time.perf_counter() - started)
    return best, verdicts


def comparable(verdicts: list) -> list:
    return [dataclasses.replace(verdict, duration_s=0.0) for verdict in verdicts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", help="a running Ray cluster (default: start a 2-node one on this machine)")
    parser.add_argument("--samples", type=int, default=164)
    parser.add_argument("--pool-size", type=int, default=1, help="sandboxes of the local pool and of each Ray worker")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    base = ["envs.domains={code = 1.0}", 'sandbox.backend="bwrap"', f"sandbox.pool_size={args.pool_size}",
            f"sandbox.timeout_s={TIMEOUT_S}"]
    config = load_config(None, base)
    mixture = build_mixture(config)
    pairs = [(task, task.reference_answer) for task in mixture.envs["code"].all_tasks()[:args.samples]]

    rows: list[tuple[str, int, float, bool]] = []  # (name, sandboxes, seconds, same verdicts as local)
    local = build_sandbox_pool(config, mixture)
    try:
        local_s, expected = measure(local, mixture, pairs, args.rounds)
    finally:
        local.close()
    rows.append(("local pool", args.pool_size, local_s, True))
    from tests.helpers.ray_cluster import local_ray_cluster

    cluster = contextlib.nullcontext(args.address) if args.address else local_ray_cluster((2, 1))
    with cluster as running:
        address = running if isinstance(running, str) else running.address
        for workers in (1, 2):
            ray_config = load_config(None, base + [f'cluster.ray_address="{address}"', f"cluster.ray_workers={workers}"])
            pool = build_sandbox_pool(ray_config, mixture)
            try:
                seconds, verdicts = measure(pool, mixture, pairs, args.rounds)
                nodes = len({info.node_id for info in pool.infos})
            finally:
                pool.close()
            rows.append((f"ray, {workers} worker{'s' if workers > 1 else ''} on {nodes} node{'s' if nodes > 1 else ''}",
                         workers * args.pool_size, seconds, comparable(verdicts) == comparable(expected)))

    passed = sum(verdict.passed for verdict in expected)
    print(f"{len(pairs)} HumanEval canonical solutions ({passed} pass), bwrap sandboxes, best of {args.rounds} rounds")
    print(f"{'':34} {'sandboxes':>9} {'seconds':>8} {'verif/s':>8} {'vs local':>8}  same verdicts")
    for name, sandboxes, seconds, same in rows:
        print(f"{name:34} {sandboxes:>9} {seconds:>8.2f} {len(pairs) / seconds:>8.1f} {local_s / seconds:>7.2f}x  "
              f"{'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
