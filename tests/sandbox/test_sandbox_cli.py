"""`rlpipe sandbox run|selftest` through typer's test runner (the sub-app alone), and the exit
statuses of `rlpipe sandbox run` through the real command in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from rlpipe.cli.sandbox import EXIT_OOM, EXIT_SANDBOX_FAILED, EXIT_TIMEOUT, app
from tests.sandbox._bwrap_support import require_bwrap

pytestmark = pytest.mark.bwrap
runner = CliRunner()


def sandbox_run(*args: str) -> subprocess.CompletedProcess[str]:
    """`rlpipe sandbox run ARGS` as a user runs it (a fresh interpreter, a real exit status)."""
    return subprocess.run([sys.executable, "-m", "rlpipe.cli.main", "sandbox", "run", *args],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, COLUMNS="40"))


def test_run_prints_the_exec_result_as_json_and_exits_with_the_command_status():
    require_bwrap()
    result = runner.invoke(app, ["run", "--json", "--", "python3", "-c", "print('hi'); raise SystemExit(3)"])
    assert result.exit_code == 3, result.output
    payload = json.loads(result.stdout)
    assert payload["exit_code"] == 3 and payload["stdout"] == "hi\n" and payload["timed_out"] is False


def test_run_reports_a_timeout():
    require_bwrap()
    result = runner.invoke(app, ["run", "--json", "--timeout-s", "0.3", "--", "sleep", "5"])
    payload = json.loads(result.stdout)
    assert payload["timed_out"] is True and payload["exit_code"] is None
    assert result.exit_code == EXIT_TIMEOUT


@pytest.mark.parametrize("status", [0, 3, 255])
def test_the_real_command_exits_with_the_status_of_the_sandboxed_command(status):
    require_bwrap()
    result = sandbox_run("--", "sh", "-c", f"exit {status}")
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr


def test_the_real_command_exits_124_on_a_timeout():
    require_bwrap()
    result = sandbox_run("--timeout-s", "0.5", "--json", "--", "sleep", "30")
    assert result.returncode == EXIT_TIMEOUT == 124, result.stderr
    assert json.loads(result.stdout)["timed_out"] is True


def test_the_real_command_exits_137_when_the_command_runs_out_of_memory():
    require_bwrap()
    # 1 GiB in one allocation under a 64 MiB limit: the memory cgroup kills it, or (without
    # cgroups) RLIMIT_AS makes the allocation fail with MemoryError; both are an OOM
    result = sandbox_run("--memory-mb", "64", "--json", "--", "python3", "-c", "x = bytearray(1 << 30)")
    assert result.returncode == EXIT_OOM == 137, (result.stdout, result.stderr)
    assert json.loads(result.stdout)["oom_killed"] is True


def test_the_real_command_exits_125_when_the_sandbox_cannot_start(tmp_path):
    # no bwrap on PATH (the interpreter is called by its full path): the backend is unavailable
    result = subprocess.run([sys.executable, "-m", "rlpipe.cli.main", "sandbox", "run", "--", "true"],
                            capture_output=True, text=True, timeout=120, env=dict(os.environ, PATH=str(tmp_path)))
    assert result.returncode == EXIT_SANDBOX_FAILED == 125, result.stderr
    assert "error:" in result.stderr and "Traceback" not in result.stderr


def test_run_prints_a_table_by_default():
    require_bwrap()
    result = runner.invoke(app, ["run", "--", "echo", "hello"])
    assert result.exit_code == 0 and "exit code" in result.stdout and "hello" in result.stdout


def test_an_unavailable_backend_is_a_short_error_with_exit_125(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    result = runner.invoke(app, ["run", "--", "true"])
    assert result.exit_code == EXIT_SANDBOX_FAILED and "Traceback" not in result.output


@pytest.mark.docker
def test_run_on_docker_prints_the_exec_result_as_json():
    from tests.helpers.docker_engine import require_docker_engine

    require_docker_engine()
    result = runner.invoke(app, ["run", "--backend", "docker", "--json", "--", "python3", "-c", "print('hi'); raise SystemExit(3)"])
    assert result.exit_code == 3, result.output
    payload = json.loads(result.stdout)
    assert payload["exit_code"] == 3 and payload["stdout"] == "hi\n"


@pytest.mark.parametrize(("backend", "module", "function"), [
    ("bwrap", "rlpipe.sandbox.bwrap", "reap_leaked_sandboxes"),
    ("docker", "rlpipe.sandbox.docker_backend", "remove_leaked_containers"),
])
def test_each_backend_reaps_its_own_leaks(monkeypatch, backend, module, function):
    import importlib

    from rlpipe.cli.sandbox import Backend, reap_leaked

    monkeypatch.setattr(importlib.import_module(module), function, lambda: 3)
    assert reap_leaked(Backend(backend)) == 3
