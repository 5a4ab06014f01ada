"""`rlpipe query` streams: at most --limit rows are printed (0: all) with a line when rows
were left out, --json stays one JSON document, and the rows pass through Python a batch at
a time, never the whole result at once."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tracemalloc
from pathlib import Path

import pytest
from rich.console import Console

from rlpipe.cli.query_output import BATCH_ROWS, print_query
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import StepManifest
from tests.cli.cli_process import run_rlpipe
from tests.cli.test_query_output import make_lake
from tests.helpers.trajectories import make_trajectories

ORDERED = "select step, sample_idx from trajectories order by step, sample_idx"  # 6 rows: steps 1, 2 of 3 rows


def _table_rows(stdout: str) -> list[list[str]]:
    return [line.replace("│", " ").split() for line in stdout.splitlines() if line.startswith("│")]


def test_limit_cuts_the_rows_and_says_so(tmp_path: Path) -> None:
    lake = make_lake(tmp_path / "lake")
    cut = run_rlpipe(["query", ORDERED, "--lake", lake, "--limit", "4"], tmp_path)
    assert cut.returncode == 0, cut.stderr
    assert _table_rows(cut.stdout) == [["1", "0"], ["1", "1"], ["1", "2"], ["2", "0"]]
    assert "first 4 rows" in cut.stdout and "--limit 0" in cut.stdout
    for every in (["--limit", "0"], ["--limit", "6"]):
        whole = run_rlpipe(["query", ORDERED, "--lake", lake, *every], tmp_path)
        assert whole.returncode == 0, whole.stderr
        assert len(_table_rows(whole.stdout)) == 6 and "left out" not in whole.stdout


def test_json_stays_one_document_and_the_note_goes_to_stderr(tmp_path: Path) -> None:
    lake = make_lake(tmp_path / "lake")
    cut = run_rlpipe(["query", ORDERED, "--lake", lake, "--json", "--limit", "2"], tmp_path)
    assert cut.returncode == 0, cut.stderr
    assert json.loads(cut.stdout) == [{"step": 1, "sample_idx": 0}, {"step": 1, "sample_idx": 1}]
    assert "first 2 rows" in cut.stderr
    whole = run_rlpipe(["query", "select count(*) as n, sum(step) as s from trajectories", "--lake", lake, "--json"], tmp_path)
    assert whole.stdout == json.dumps([{"n": 6, "s": 9}], indent=2) + "\n"  # a HUGEINT sum stays a number
    empty = run_rlpipe(["query", "select * from steps where step < 0", "--lake", lake, "--json"], tmp_path)
    assert json.loads(empty.stdout) == [] and empty.stderr == ""
    negative = run_rlpipe(["query", ORDERED, "--lake", lake, "--limit", "-1"], tmp_path)
    assert negative.returncode == 2


def test_the_rows_pass_through_python_a_batch_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lake = Lake.open(str(tmp_path / "lake"))
    text_chars, steps, rows_per_step = 20_000, 4, BATCH_ROWS
    for step in range(steps):
        rows = [dataclasses.replace(row, completion=dataclasses.replace(row.completion, text=f"{i:05d}" + "x" * text_chars))
                for i, row in enumerate(make_trajectories("big", step, rows_per_step))]
        part = lake.write_part("big", step, "00000", rows)
        lake.commit_step(StepManifest(run_id="big", step=step, policy_version=step, parts=(part,), rows=len(rows),
                                      metrics=(), committed_at_ms=step))
    result_bytes = steps * rows_per_step * text_chars
    with open(os.devnull, "w") as devnull:
        monkeypatch.setattr(sys, "stdout", devnull)
        tracemalloc.start()
        try:
            printed = print_query(lake, "select completion_text from trajectories", True, Console(file=devnull), limit=0)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert printed == steps * rows_per_step
    assert peak < result_bytes / 2  # about one batch of rows as Python strings, not every row
