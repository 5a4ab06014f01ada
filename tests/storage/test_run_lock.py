"""One writer per run (storage/run_lock.py): a second `rlpipe train` of a run that another
process writes is refused before it starts anything, on a local lake (flock, released by the
kernel when the holder dies, kill -9 included) and on S3 (a lease renewed while the holder
lives, taken over once it stops changing)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rich.console import Console

from rlpipe.cli.runs import print_runs, resume_command, run_report
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import RunInfo, RunState, RunStatus
from rlpipe.storage.run_lock import LOCKS, RunInUse, hold_run, run_is_held
from tests.durability.cli_runs import REPO_ROOT, cli_env, make_where, run_cli

HOLDER = """
import sys
from rlpipe.storage.lake import Lake
from rlpipe.storage.run_lock import hold_run
hold = hold_run(Lake.open(sys.argv[1]).location, "r1")
print("held", flush=True)
sys.stdin.read()  # until the test kills it
"""


def _holder_process(lake_uri: str) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", HOLDER, lake_uri], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def test_a_local_run_held_by_a_live_process_is_refused_and_taken_once_it_was_killed(local_lake: Lake) -> None:
    holder = _holder_process(local_lake.uri)
    try:
        with pytest.raises(RunInUse, match=f"run r1 is being written by another rlpipe process \\(pid {holder.pid} on "):
            hold_run(local_lake.location, "r1")
        hold_run(local_lake.location, "r2").release()  # another run of the lake is free
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    hold_run(local_lake.location, "r1").release()  # the kernel released the dead holder's lock


def test_one_process_cannot_hold_a_run_twice_and_release_frees_it(local_lake: Lake) -> None:
    first = hold_run(local_lake.location, "r1")
    with pytest.raises(RunInUse):
        hold_run(local_lake.location, "r1")
    first.release()
    first.release()  # idempotent
    hold_run(local_lake.location, "r1").release()


def test_an_s3_lease_that_is_renewed_is_refused_and_free_once_released(s3_lake: Lake) -> None:
    first = hold_run(s3_lake.location, "r1", ttl_s=2.0, renew_s=0.2)
    try:
        with pytest.raises(RunInUse, match="run r1 is being written by another rlpipe process"):
            hold_run(s3_lake.location, "r1", ttl_s=2.0, renew_s=0.2)
    finally:
        first.release()
    assert s3_lake.objects.get(f"{LOCKS}/r1.json") is None  # released: the lease is gone
    hold_run(s3_lake.location, "r1", ttl_s=2.0, renew_s=0.2).release()


def test_an_s3_lease_a_dead_holder_left_is_taken_over_once_it_stopped_changing(s3_lake: Lake) -> None:
    dead = {"owner": "a-killed-process", "pid": 4242, "host": "elsewhere", "since_ms": 0, "renewed": "x"}
    s3_lake.objects.put(f"{LOCKS}/r1.json", json.dumps(dead).encode())
    started = time.monotonic()
    hold = hold_run(s3_lake.location, "r1", ttl_s=1.0, renew_s=0.2)
    try:
        assert time.monotonic() - started >= 1.0  # it watched the lease for ttl_s before taking it
        taken = json.loads(s3_lake.objects.get(f"{LOCKS}/r1.json") or b"{}")
        assert taken["owner"] != "a-killed-process" and taken["pid"] == os.getpid()
    finally:
        hold.release()


def test_a_second_train_of_a_run_in_use_exits_2_with_one_line_and_starts_nothing(tmp_path: Path,
                                                                                  prefect_api_url: str) -> None:
    where = make_where(tmp_path)
    hold = hold_run(Lake.open(where.lake_uri).location, "busy")
    try:
        result = run_cli(["train", str(where.config_path), "--run-id", "busy"], cli_env(where, prefect_api_url), tmp_path)
    finally:
        hold.release()
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"run busy is being written by another rlpipe process (pid {os.getpid()} on" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (Path(where.lake_uri) / "runs" / "busy").exists()  # nothing of the refused run was written


@pytest.mark.parametrize("lake_kind", ["local", "s3"])
def test_runs_show_tells_a_running_run_from_one_whose_process_is_gone(lake_kind: str, request: pytest.FixtureRequest) -> None:
    """status.json says running in both cases; only the hold tells a live writer from a killed one."""
    lake: Lake = request.getfixturevalue(f"{lake_kind}_lake")
    lake.write_run_info(RunInfo(run_id="r1", config_json="{}", config_hash="h", code_version="x", created_at_ms=1))
    lake.write_status(RunStatus(run_id="r1", state=RunState.RUNNING, step=3, stage="verify", error=None, updated_at_ms=9))
    hold = hold_run(lake.location, "r1", ttl_s=2.0, renew_s=0.2)
    try:
        assert run_is_held(lake.location, "r1")
        held = run_report(lake, "r1")
        assert held["state_detail"] == "running (step 3, verify)" and held["resume_command"] is None
        assert _listed_state(lake) == "running"
    finally:
        hold.release()
    assert not run_is_held(lake.location, "r1")
    gone = run_report(lake, "r1")
    assert gone["state_detail"].startswith("stopped at step 3 in stage verify: no process writes it")
    assert gone["resume_command"] == resume_command("r1", lake.uri)
    assert _listed_state(lake) == "stopped"


def _listed_state(lake: Lake) -> str:
    """`runs list --json`'s state of r1."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_runs(lake, json_out=True, console=Console())
    return next(row["state"] for row in json.loads(out.getvalue()) if row["run_id"] == "r1")
