"""^C and SIGTERM end `rlpipe train` in order.

Runs the real CLI on a pseudo-terminal: ^C is the byte 0x03 written to the terminal, so the
kernel sends SIGINT to the whole foreground process group, as a user's ^C does; SIGTERM is
`kill PID` (the CLI alone: it must stop its workers itself). Each signal is sent once, in one
mode: SIGTERM here, in ephemeral mode (Prefect's temporary server, no PREFECT_API_URL) during
the warm start; ^C during an RL step with a Prefect server, under `rlpipe up`, in
tests/cli/test_up_serves_train.py (which imports this module's helpers). After the signal the
command must: exit 130 (SIGINT) or 143 (SIGTERM) (a run still alive 600 s after it is hung:
killed, and the test fails), print one line with the resume command and no traceback, leave
no process behind (no process carries the run's PREFECT_HOME in its environment, and no
worker the runs forked from the session's shared zygote is left), and have
marked the run interrupted in the lake (status.json), MLflow (KILLED) and Prefect (Crashed).
Then the run resumes to the end. `rlpipe runs show` of an interrupted or failed run prints
the resume command (in-process: the command's output, not a process's start-up, is tested).
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import signal
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client

from rlpipe.core.config import load_config
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import RunInfo, RunState, RunStatus
from typer.testing import CliRunner

from rlpipe.cli.main import app
from tests.durability.cli_runs import RLPIPE, cli_env, make_where, run_cli
from tests.helpers.prefect_db import seed_prefect_home
from tests.helpers.processes import shared_zygote_workers

# The interrupted flow run's state: Crashed (Prefect's state for a signal); Failed when the
# signal landed in Prefect's own task set-up, which then raises ValueError("Task run is not
# set") from the KeyboardInterrupt (prefect 3.9 task_engine.handle_crash).
ENDED = ("CRASHED", "FAILED")
# A hang guard, not a speed check: a run still alive this long after the signal is hung, and
# is killed so that the test fails on its return code instead of blocking the suite.
HANG_GUARD_S = 600
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# 100 warm-start steps of 8 examples: long enough that a signal sent as it begins lands
# inside it; 6 RL steps (checkpoints 0, 2, 4, 6) so a signal after step 1 lands in an RL step
# (the ^C under `rlpipe up` in tests/cli/test_up_serves_train.py).
TOML = """\
seed = 3
[train]
steps = 6
[rollout]
prompts_per_step = 4
group_size = 4
[warmstart]
steps = 100
batch_size = 8
[envs]
train_size = 100
heldout_size = 8
domains = {reverse = 1.0}
[checkpoint]
every_steps = 2
"""
# The SIGTERM during the warm start: its resume starts over (warm start and both steps), so
# the run is kept short; 60 warm-start steps still outlast the signal sent as they begin.
EPHEMERAL_TOML = TOML.replace("steps = 6\n", "steps = 2\n", 1).replace("steps = 100\n", "steps = 60\n", 1)
assert "steps = 2\n" in EPHEMERAL_TOML and "steps = 60\n" in EPHEMERAL_TOML


@dataclass(frozen=True)
class Interrupted:
    returncode: int
    output: str
    seconds_after_signal: float


def run_on_pty(args: list[str], env: dict[str, str], cwd: Path, ready: Callable[[], bool], send: str) -> Interrupted:
    """Start the CLI with a pty as its controlling terminal; once `ready()` is true send ^C
    (`send="int"`) or SIGTERM (`send="term"`) and read until it exits."""
    pid, master = pty.fork()
    if pid == 0:  # the child: its own session, the pty its terminal
        os.chdir(cwd)
        os.execve(RLPIPE[0], RLPIPE + args, env)
    output, sent_at, deadline = b"", None, time.monotonic() + 1800
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
        if sent_at is None and ready():
            sent_at = time.monotonic()
            if send == "int":
                os.write(master, b"\x03")  # the terminal turns it into SIGINT for the foreground group
            else:
                os.kill(pid, signal.SIGTERM)
        if sent_at is not None and time.monotonic() - sent_at > HANG_GUARD_S:
            os.kill(pid, signal.SIGKILL)
            break
    _, status = os.waitpid(pid, 0)
    os.close(master)
    assert sent_at is not None, "the run never got ready for the signal:\n" + _text(output)[-3000:]
    return Interrupted(os.waitstatus_to_exitcode(status), _text(output), time.monotonic() - sent_at)


def _text(raw: bytes) -> str:
    return ANSI.sub("", raw.decode(errors="replace")).replace("\r", "\n")


def processes_with(marker: str) -> list[str]:
    """Command lines of live processes whose environment holds `marker` (the run's private
    PREFECT_HOME: every process the CLI started inherits it, the Prefect server included)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def wait_for_no_process(marker: str, timeout_s: float = 20) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def wait_for_no_new_worker(before: set[int], timeout_s: float = 20) -> set[int]:
    """The shared zygote's workers (tests/helpers/processes.py) not among `before` that are
    still alive after `timeout_s`: what the runs started since then left behind. Their
    /proc environment is the zygote's, so `wait_for_no_process` does not see them."""
    deadline = time.monotonic() + timeout_s
    while (left := shared_zygote_workers() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def warmstart_started(lake: Path, run_id: str) -> Callable[[], bool]:
    return (lake / "runs" / run_id / "progress" / "warmstart.json").exists  # written as it begins


def step_committed(lake: Path, run_id: str, step: int) -> Callable[[], bool]:
    manifest = lake / "runs" / run_id / "steps" / f"{step:06d}" / "MANIFEST.json"
    return manifest.exists


async def flow_run_states(name: str) -> list[str]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    async with get_client() as client:
        runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
        return [run.state.type.value for run in sorted(runs, key=lambda run: run.created)]


async def step_table(key: str) -> list[dict]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async with get_client() as client:
        artifacts = await client.read_latest_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        assert len(artifacts) == 1, artifacts
        data = artifacts[0].data
        return data if isinstance(data, list) else json.loads(data)


def ephemeral_states(prefect_home: Path, name: str) -> list[str]:
    """Flow-run state types in the temporary server's database (it is stopped by now)."""
    with sqlite3.connect(prefect_home / "prefect.db") as db:
        return [row[0] for row in db.execute("select state_type from flow_run where name = ? order by created", (name,))]


def check_interrupted(result: Interrupted, lake_uri: str, run_id: str, signal_name: str, code: int) -> dict:
    assert result.returncode == code, f"ended {result.seconds_after_signal:.0f} s after the signal:\n" + result.output[-4000:]
    assert "Traceback" not in result.output and "Error logging to API" not in result.output, result.output[-4000:]
    lines = [line for line in result.output.splitlines() if "resume with:" in line]
    assert len(lines) == 1, result.output[-4000:]
    status = Lake.open(lake_uri).read_status(run_id)
    assert status is not None and status.state.value == "failed" and status.error == f"interrupted by {signal_name}"
    expected = f"interrupted ({signal_name}) at step {status.step} ({status.stage}); resume with: rlpipe resume {run_id} --lake {lake_uri}"
    assert lines[0].strip() == expected
    info = Lake.open(lake_uri).read_run_info(run_id)
    mlflow = MlflowClient(tracking_uri=Lake.open(lake_uri).read_json(run_id, "links.json")["mlflow_tracking_uri"])
    assert mlflow.get_run(info.mlflow_run_id).info.status == "KILLED"
    return {"step": status.step, "stage": status.stage}


@pytest.mark.slow
def test_sigterm_in_ephemeral_mode_ends_in_order_and_the_run_resumes(
    tmp_path: Path, prefect_db_snapshot: Path | None, prefect_api_url: str
) -> None:
    """SIGTERM during the warm start of a run on Prefect's temporary server; the run then
    resumes to the end against a Prefect server (the session's harness), as after a user
    starts `rlpipe up`: the interrupted flow run stays in the temporary server's database."""
    where = make_where(tmp_path, EPHEMERAL_TOML)
    run_id = "sig-eph-term"
    env = cli_env(where, prefect_api_url=None)  # workers from the shared zygote, where its settings fit
    env.pop("PREFECT_API_URL", None)  # ephemeral mode: Prefect's temporary server
    workers_before = shared_zygote_workers()
    seed_prefect_home(Path(env["PREFECT_HOME"]), prefect_db_snapshot)  # a ready database: no migration
    result = run_on_pty(["train", str(where.config_path), "--run-id", run_id], env, tmp_path,
                        warmstart_started(Path(where.lake_uri), run_id), "term")
    where_stopped = check_interrupted(result, where.lake_uri, run_id, "SIGTERM", 143)
    assert where_stopped == {"step": 0, "stage": "warm-start"}
    assert wait_for_no_process(env["PREFECT_HOME"]) == []
    assert wait_for_no_new_worker(workers_before) == set()
    states = ephemeral_states(Path(env["PREFECT_HOME"]), run_id)
    assert len(states) == 1 and states[0] in ENDED

    shown = CliRunner().invoke(app, ["runs", "show", run_id, "--lake", where.lake_uri], env={"COLUMNS": "200"})
    assert f"resume with: rlpipe resume {run_id} --lake {where.lake_uri}" in shown.output.splitlines(), shown.output
    served = cli_env(where, prefect_api_url=prefect_api_url)
    resumed = run_cli(["resume", run_id, "--lake", where.lake_uri], served, tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert Lake.open(where.lake_uri).committed_steps(run_id) == [1, 2]
    assert asyncio.run(flow_run_states(run_id)) == ["COMPLETED"]
    assert wait_for_no_process(env["PREFECT_HOME"]) == []
    assert wait_for_no_new_worker(workers_before) == set()


@pytest.mark.parametrize(
    ("error", "shown"),
    [("ValueError: boom", "failed at step 3 in stage verify: ValueError: boom"),
     ("interrupted by SIGTERM", "interrupted by SIGTERM at step 3 in stage verify")],
)
def test_runs_show_of_a_failed_or_interrupted_run_prints_the_resume_command(tmp_path: Path, error: str, shown: str) -> None:
    lake_uri = str(tmp_path / "lake")
    lake = Lake.open(lake_uri)
    config = load_config(None, [])
    lake.write_run_info(RunInfo("r-7", config.model_dump_json(), config.config_hash(), "test", 1))
    lake.write_status(RunStatus("r-7", RunState.FAILED, 3, "verify", error, 2))
    wide = {"COLUMNS": "200"}  # a line the test reads whole: wider than any temporary path
    result = CliRunner().invoke(app, ["runs", "show", "r-7", "--lake", lake_uri], env=wide)
    assert result.exit_code == 0, result.output
    assert shown in result.output
    assert f"resume with: rlpipe resume r-7 --lake {lake_uri}" in result.output.splitlines()

    lake.write_status(RunStatus("r-7", RunState.FINISHED, 6, "done", None, 3))
    finished = CliRunner().invoke(app, ["runs", "show", "r-7", "--lake", lake_uri], env=wide)
    assert finished.exit_code == 0, finished.output
    assert "resume with" not in finished.output


@pytest.mark.slow
def test_the_temporary_prefect_server_does_not_outlive_a_killed_cli(tmp_path: Path, prefect_db_snapshot: Path | None) -> None:
    """SIGKILL leaves no time to stop anything: the kernel's parent-death signal ends the
    server, which runs in its own session (a terminal ^C reaches only the CLI)."""
    import subprocess
    import sys

    env = cli_env(make_where(tmp_path), prefect_api_url=None)
    env.pop("PREFECT_API_URL", None)
    seed_prefect_home(Path(env["PREFECT_HOME"]), prefect_db_snapshot)
    program = (
        "import time\n"
        "from prefect.server.api.server import SubprocessASGIServer\n"
        "from rlpipe.orchestration.prefect_server import temporary_prefect_server\n"
        "with temporary_prefect_server():\n"
        "    print(SubprocessASGIServer._instances[None].server_process.pid, flush=True)\n"
        "    time.sleep(600)\n"
    )
    cli = subprocess.Popen([sys.executable, "-c", program], env=env, stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(cli.stdout.readline())
        assert os.getsid(server_pid) != os.getsid(cli.pid)
    finally:
        cli.kill()
        cli.wait()
    assert wait_for_no_process(env["PREFECT_HOME"]) == []
