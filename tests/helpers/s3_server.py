"""Start a moto S3 server as its own process on 127.0.0.1, for tests that need real HTTP S3.

What it does: picks a free loopback port, launches the `moto_server` console script next to
the running interpreter, waits until it answers, and returns its endpoint URL and a stop
function that terminates the process; `unique_bucket` names a bucket no other test uses (the
session shares one server: tests/conftest.py). What it does not: create buckets or set
credentials (moto accepts any keys; the code under test creates its buckets), or reach the
network.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

from tests.helpers.ports import free_port

STARTUP_TIMEOUT_S = 120.0  # a hang guard: a loaded 2-core box starts moto slowly


def unique_bucket(stem: str) -> str:
    """A valid S3 bucket name that no other test uses: unique_bucket("lake") -> "lake-1f0c9a2b7d3e"."""
    return f"{stem}-{uuid.uuid4().hex[:12]}"


def _moto_server_command(port: int) -> list[str]:
    script = Path(sys.executable).parent / "moto_server"
    if script.exists():
        return [str(script), "-H", "127.0.0.1", "-p", str(port)]
    return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


def _wait_until_up(endpoint_url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(f"{endpoint_url}/moto-api/", timeout=1.0):
                return
        except urllib.error.HTTPError:
            return  # it answered, even if with an error status
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"moto_server did not answer at {endpoint_url} in {STARTUP_TIMEOUT_S}s")


def start_moto_server() -> tuple[str, Callable[[], None]]:
    """Start moto_server on a free loopback port; return (endpoint_url, stop)."""
    port = free_port()
    endpoint_url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    process = subprocess.Popen(
        _moto_server_command(port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    _wait_until_up(endpoint_url, process)

    def stop() -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)

    return endpoint_url, stop
