"""`rlpipe query` output on a narrow terminal: a result with more columns than fit is printed
one record per row (every column name and value whole), never as a table squeezed to
empty cells; a narrow result stays a table."""

from __future__ import annotations

from pathlib import Path

from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import StepManifest
from tests.cli.cli_process import run_rlpipe
from tests.helpers.trajectories import make_trajectories


def make_lake(root: Path) -> str:
    lake = Lake.open(str(root))
    for step in (1, 2):
        part = lake.write_part("run-q", step, "00000", make_trajectories("run-q", step, 3))
        lake.commit_step(StepManifest(run_id="run-q", step=step, policy_version=step, parts=(part,), rows=3,
                                      metrics=(("reward/mean", step / 10),), committed_at_ms=step))
    return str(root)


def test_a_wide_result_prints_one_record_per_row(tmp_path: Path) -> None:
    lake = make_lake(tmp_path / "lake")
    result = run_rlpipe(["query", "select * from trajectories order by step, sample_idx limit 2", "--lake", lake], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("-- row")] == ["-- row 1 --", "-- row 2 --"]
    fields = dict(line.split(None, 1) for line in lines if not line.startswith("-- row") and len(line.split(None, 1)) == 2)
    assert fields["run_id"] == "run-q" and fields["step"] == "1" and "completion_policy_version" in fields


def test_a_narrow_result_stays_a_table(tmp_path: Path) -> None:
    lake = make_lake(tmp_path / "lake")
    result = run_rlpipe(["query", "select step, count(*) as n from trajectories group by 1 order by 1", "--lake", lake], tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    assert [row.replace("│", " ").split() for row in rows] == [["1", "3"], ["2", "3"]]
