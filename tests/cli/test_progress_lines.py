"""`rlpipe train`'s progress where the output is not a terminal (a pipe, a log, CI): plain
lines from the lake as the run moves (cli/progress.py), where rich would draw its bars only
once, at the end."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from rlpipe.cli.progress import PlainLines, follow_run
from rlpipe.core.config import load_config
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import RunState, RunStatus
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
