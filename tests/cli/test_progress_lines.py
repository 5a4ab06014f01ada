"""`rlpipe train`'s progress where the output is not a terminal (a pipe, a log, CI): plain
lines from the lake as the run moves (cli/progress.py), where rich would draw its bars only
once, at the end."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from rlpipe.cli.progress import CommittedSteps, PlainLines, follow_run
from rlpipe.core.config import load_config
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import RunState, RunStatus, StepManifest
from tests.helpers.trajectories import make_trajectories
from tests.helpers.waiting import wait_until


def _wait_for(text: str, output: io.StringIO) -> None:
    wait_until(lambda: text in output.getvalue(), f"the line {text!r}")


def test_a_run_logged_to_a_file_prints_plain_lines_as_the_warm_start_moves(tmp_path: Path) -> None:
    config = load_config(None, [f'storage.lake_uri="{tmp_path / "lake"}"', "train.steps=3"])
    lake = Lake.open(str(tmp_path / "lake"))
    output = io.StringIO()  # not a terminal
    status = RunStatus(run_id="logged", state=RunState.RUNNING, step=0, stage="warm-start", error=None, updated_at_ms=1)
    lake.write_status(status)
    with follow_run(config, "logged", Console(file=output, width=40), plain_every_s=0):
        lake.write_json("logged", "progress/warmstart.json", {"steps_done": 5, "steps_max": 300, "loss": 0.5})
        _wait_for("warm-start 5/300", output)
        lake.write_json("logged", "progress/warmstart.json", {"steps_done": 10, "steps_max": 300, "loss": 0.25})
        _wait_for("warm-start 10/300", output)
    lines = output.getvalue().splitlines()
    assert any(line.endswith("warm-start 5/300  loss 0.500") for line in lines), lines
    assert any(line.endswith("warm-start 10/300  loss 0.250") for line in lines), lines


def test_plain_lines_say_nothing_twice_and_wait_between_lines() -> None:
    output = io.StringIO()
    lines = PlainLines(Console(file=output, width=200), every_s=3600)
    lines.offer("RL steps 1/5  update")
    lines.offer("RL steps 1/5  update")  # the same: nothing
    lines.offer("RL steps 2/5  update")  # changed, but within every_s: nothing
    lines.offer("RL steps 5/5  done", final=True)  # the last one is always said
    said = output.getvalue().splitlines()
    assert [line.split("] ", 1)[1] for line in said] == ["RL steps 1/5  update", "RL steps 5/5  done"]


class _CountingLake:
    """A real Lake whose step listings are counted (the progress poll's costly call)."""

    def __init__(self, lake: Lake) -> None:
        self.lake, self.listings = lake, 0

    def committed_steps(self, run_id: str) -> list[int]:
        self.listings += 1
        return self.lake.committed_steps(run_id)

    def read_manifest(self, run_id: str, step: int):  # noqa: ANN201 - the Lake's
        return self.lake.read_manifest(run_id, step)


def _commit(lake: Lake, step: int, reward: float) -> None:
    part = lake.write_part("followed", step, "00000", make_trajectories("followed", step, 2))
    lake.commit_step(StepManifest(run_id="followed", step=step, policy_version=step - 1, parts=(part,), rows=2,
                                  metrics=(("reward/mean", reward),), committed_at_ms=1_700_000_000_000 + step))


def test_committed_steps_are_listed_once_then_followed_manifest_by_manifest(tmp_path: Path) -> None:
    lake = _CountingLake(Lake.open(str(tmp_path / "lake")))
    committed = CommittedSteps(lake, "followed", relist_s=3600)  # type: ignore[arg-type]
    assert committed.poll() == (0, None)
    for step in (1, 2):
        _commit(lake.lake, step, reward=step / 10)
    count, newest = committed.poll()
    assert (count, newest.step, newest.metric("reward/mean")) == (2, 2, 0.2)
    _commit(lake.lake, 3, reward=0.3)
    count, newest = committed.poll()
    assert (count, newest.step) == (3, 3)
    assert committed.poll()[0] == 3
    assert lake.listings == 1  # one listing; every later poll read the manifest after the newest


def test_committed_steps_found_out_of_order_are_counted_at_the_next_listing(tmp_path: Path) -> None:
    lake = _CountingLake(Lake.open(str(tmp_path / "lake")))
    committed = CommittedSteps(lake, "followed", relist_s=0)  # a listing every poll
    _commit(lake.lake, 1, reward=0.1)
    _commit(lake.lake, 3, reward=0.3)  # step 2 missing: the manifest probe stops at it
    count, newest = committed.poll()
    assert (count, newest.step) == (2, 3)  # type: ignore[union-attr]
    _commit(lake.lake, 2, reward=0.2)
    count, newest = committed.poll()
    assert (count, newest.step) == (3, 3), (count, newest)  # type: ignore[union-attr]
