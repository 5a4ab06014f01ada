"""`rlpipe sandbox run|selftest` through typer's test runner (the sub-app alone)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlpipe.cli.sandbox import app
from tests.sandbox._bwrap_support import require_bwrap

pytestmark = pytest.mark.bwrap
runner = CliRunner()


def test_run_prints_the_exec_result_as_json():
    require_bwrap()
    result = runner.invoke(app, ["run", "--json", "--", "python3", "-c", "print('hi'); raise SystemExit(3)"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["exit_code"] == 3 and payload["stdout"] == "hi\n" and payload["timed_out"] is False


def test_run_reports_a_timeout():
    require_bwrap()
    result = runner.invoke(app, ["run", "--json", "--timeout-s", "0.3", "--", "sleep", "5"])
    payload = json.loads(result.stdout)
    assert payload["timed_out"] is True and payload["exit_code"] is None


def test_run_prints_a_table_by_default():
    require_bwrap()
    result = runner.invoke(app, ["run", "--", "echo", "hello"])
    assert result.exit_code == 0 and "exit code" in result.stdout and "hello" in result.stdout


def test_an_unavailable_backend_is_a_short_error_with_exit_2(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    result = runner.invoke(app, ["run", "--", "true"])
    assert result.exit_code == 2 and "Traceback" not in result.output


@pytest.mark.docker
def test_run_on_docker_prints_the_exec_result_as_json():
    from rlpipe.core.errors import SandboxUnavailable
    from rlpipe.sandbox.docker_backend import docker_client

    try:
        docker_client()
    except SandboxUnavailable as exc:
        pytest.skip(f"no docker engine: {exc.message}")
    result = runner.invoke(app, ["run", "--backend", "docker", "--json", "--", "python3", "-c", "print('hi'); raise SystemExit(3)"])
    assert result.exit_code == 0, result.output
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
