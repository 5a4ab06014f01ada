"""A writer killed with SIGKILL at an arbitrary moment leaves a consistent lake: committed
steps are exactly those with manifests, their parts read back whole, and queries count
only them."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from rlpipe.storage.lake import Lake
from rlpipe.storage.query import query_trajectories
from tests.helpers.waiting import wait_until

WRITER = textwrap.dedent(
    """
    import sys
    from rlpipe.storage.lake import Lake
    from rlpipe.storage.lake_records import StepManifest
    from tests.helpers.trajectories import make_trajectories

    lake = Lake.open(sys.argv[1])
    for step in range(100000):
        parts = tuple(
            lake.write_part("r1", step, f"p{i}", make_trajectories("r1", step, 8)) for i in range(3)
        )
        lake.commit_step(StepManifest("r1", step, step, parts, 24, (("reward/mean", 0.5),), step))
    """
)


def test_sigkill_mid_write_leaves_a_consistent_lake(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], cwd=Path(__file__).parents[2])
    lake = Lake.open(str(root))

    def four_steps_committed() -> bool:
        assert writer.poll() is None, "the writer died on its own"
        return len(lake.committed_steps("r1")) >= 4

    wait_until(four_steps_committed, "the writer to commit 4 steps")
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=10)

    steps = lake.committed_steps("r1")
    assert len(steps) >= 4 and steps == list(range(len(steps)))
    for step in steps:
        manifest = lake.read_manifest("r1", step)
        assert manifest is not None and len(lake.read_parts(manifest.parts)) == 24
    counted = query_trajectories(lake, "select count(*) from trajectories").rows
    assert counted == [(24 * len(steps),)]
