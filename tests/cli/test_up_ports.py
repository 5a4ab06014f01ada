"""`rlpipe up` with a port another process listens on fails with exit 2 and names the port,
before it starts anything (it used to start its servers, which died on the taken port,
while the other process answered the health check: "up" with nothing of its own running)."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.cli.cli_process import error_lines, run_rlpipe
from tests.helpers.ports import free_port


def _listening() -> socket.socket:
    """A socket listening on a free loopback port, as another server would."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def test_up_refuses_a_port_another_process_listens_on(tmp_path: Path) -> None:
    with _listening() as taken:  # only the Prefect port is taken
        port = taken.getsockname()[1]
        result = run_rlpipe(["up", "--prefect-port", str(port), "--mlflow-port", str(free_port())], tmp_path, timeout_s=120)
    assert result.returncode == 2, result.stdout + result.stderr
    error, hint = error_lines(result)
    assert f"port {port} " in error and "taken" in error
    assert "--prefect-port" in hint
    home = tmp_path / "rlpipe-home"
    assert not (home / "logs").exists() and not (home / "services.json").exists(), "nothing was started"


def test_up_refuses_one_port_for_both_services(tmp_path: Path) -> None:
    port = free_port()
    result = run_rlpipe(["up", "--prefect-port", str(port), "--mlflow-port", str(port)], tmp_path, timeout_s=120)
    assert result.returncode == 2, result.stdout + result.stderr
    error, hint = error_lines(result)
    assert "--prefect-port and --mlflow-port" in error and str(port) in error
    assert "own port" in hint
