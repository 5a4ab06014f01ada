"""Peak memory of `rlpipe query` printing a large result: a lake of STEPS committed steps of
ROWS rows each, every completion TEXT_CHARS characters (so the result is about
STEPS x ROWS x TEXT_CHARS bytes of text, while zstd keeps the parts small on disk), queried
with `select completion_text from trajectories --json --limit 0` into /dev/null, the CLI in
a fresh process that reports its own peak resident set (ru_maxrss).

    .venv/bin/python benchmarks/query_memory.py [--steps 200] [--rows 30] [--text-chars 100000] [--repeats 2]

Run it from a checkout to measure that checkout's `rlpipe query` (the lake is written with
its Lake API). Nothing asserts: numbers are for reading (docs/RESULTS.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI_WITH_PEAK = """
import resource, sys
from rlpipe.cli.main import main
sys.argv = ["rlpipe"] + sys.argv[1:]
try:
    main()
finally:
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def write_lake(root: Path, steps: int, rows: int, text_chars: int) -> None:
    sys.path.insert(0, str(REPO))
    from rlpipe.storage.lake import Lake
    from rlpipe.storage.lake_records import StepManifest
    from tests.helpers.trajectories import make_trajectories

    lake = Lake.open(str(root))
    for step in range(steps):
        trajectories = [dataclasses.replace(row, completion=dataclasses.replace(row.completion, text=f"{i}" + "x" * text_chars))
                        for i, row in enumerate(make_trajectories("big", step, rows))]
        part = lake.write_part("big", step, "00000", trajectories)
        lake.commit_step(StepManifest(run_id="big", step=step, policy_version=step, parts=(part,), rows=rows,
                                      metrics=(), committed_at_ms=step))


def peak_mb(lake: Path, extra: list[str]) -> float:
    done = subprocess.run([sys.executable, "-c", CLI_WITH_PEAK, "query", "select completion_text from trajectories",
                           "--lake", str(lake), "--json", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO, check=True)
    return int(done.stderr.strip().splitlines()[-1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--text-chars", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-limit-flag", action="store_true", help="for a checkout whose `rlpipe query` has no --limit")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        lake = Path(folder) / "lake"
        write_lake(lake, args.steps, args.rows, args.text_chars)
        result_mb = args.steps * args.rows * args.text_chars / 1e6
        extra = [] if args.no_limit_flag else ["--limit", "0"]
        peaks = [peak_mb(lake, extra) for _ in range(args.repeats)]
        print(f"result {result_mb:.0f} MB of text; peak resident MB per run: {', '.join(f'{peak:.0f}' for peak in peaks)}")


if __name__ == "__main__":
    main()
