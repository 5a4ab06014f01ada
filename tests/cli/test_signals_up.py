"""^C ends `rlpipe train` in order when `rlpipe up`'s services are running: the CLI finds the
Prefect server and the MLflow server from `up`'s state file (no PREFECT_API_URL, no
tracking.mlflow_uri in the config), and after ^C it exits 130 with one resume line, the run
is interrupted in the lake, KILLED in `up`'s MLflow server and ended in `up`'s Prefect
server; `rlpipe down` then leaves no process of the test behind.

`up` runs on free ports under a private RLPIPE_HOME, so it never meets a user's own `up`.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from rlpipe.storage.local_services import read_live_services
from tests.cli.test_signals import (
    ENDED, TOML, check_interrupted, flow_run_states, run_on_pty, step_committed, wait_for_no_process,
)
from tests.durability.cli_runs import cli_env, make_where, run_cli


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_ctrl_c_with_rlpipe_up_ends_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`up`'s servers run with a PREFECT_HOME of their own, so "no process left" checks the CLI's."""
    where = make_where(tmp_path, TOML)
    # The config `up`'s users write: no tracking section, so the run reports to up's MLflow.
    where.config_path.write_text(TOML + f'\n[storage]\nlake_uri = "{tmp_path / "lake"}"\n')
    lake_uri = str(tmp_path / "lake")
    run_id = f"sig-up-{os.getpid()}"
    env = cli_env(where, prefect_api_url=None)
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    prefect_port, mlflow_port = free_port(), free_port()
    up_env = dict(env, PREFECT_HOME=str(tmp_path / "up-prefect-home"))  # tells up's servers apart from the CLI's processes
    started = run_cli(["up", "--prefect-port", str(prefect_port), "--mlflow-port", str(mlflow_port)], up_env, tmp_path)
    try:
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        monkeypatch.setenv("RLPIPE_HOME", env["RLPIPE_HOME"])
        services = read_live_services()
        assert services is not None and services.prefect_api_url == f"http://127.0.0.1:{prefect_port}/api"

        result = run_on_pty(["train", str(where.config_path), "--run-id", run_id], env, tmp_path,
                            step_committed(Path(lake_uri), run_id, 1), "int")
        where_stopped = check_interrupted(result, lake_uri, run_id, "SIGINT", 130)  # MLflow: up's server, over HTTP
        assert where_stopped["step"] >= 1
        assert wait_for_no_process(env["PREFECT_HOME"]) == []  # nothing of the CLI's own is left
        with temporary_settings({PREFECT_API_URL: services.prefect_api_url}):  # over a session harness, if any
            assert asyncio.run(flow_run_states(run_id))[0] in ENDED
    finally:
        stopped = run_cli(["down"], up_env, tmp_path)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert wait_for_no_process(up_env["PREFECT_HOME"]) == []
