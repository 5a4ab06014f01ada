"""A throw-away Ray cluster on 127.0.0.1 for tests/ray (`make test-ray`, in .venv-ray).

Two nodes: a head (2 CPUs) and a second node (1 CPU) joined to it, each `ray start ... --block`
in a session of its own with its own temp dir, so stopping them (SIGTERM, then SIGKILL, to
that session's processes only) never touches another Ray on this machine: `ray stop` would
stop every Ray of the host. The object store is kept small (200 MB a node).

In the main venv (no ray) nothing here is collected: CI never starts a cluster.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

collect_ignore_glob = [] if importlib.util.find_spec("ray") is not None else ["test_*.py"]

RAY = str(Path(sys.executable).with_name("ray"))
OBJECT_STORE_BYTES = 200_000_000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_node(args: list[str], temp_dir: Path, log: Path) -> subprocess.Popen:
    command = [RAY, "start", "--node-ip-address", "127.0.0.1", "--object-store-memory", str(OBJECT_STORE_BYTES),
               "--temp-dir", str(temp_dir), "--disable-usage-stats", "--block", *args]
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def stop_node(node: subprocess.Popen) -> None:
    """Stop every process of the node's session (raylet, gcs, its workers), nothing else."""
    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):  # ray start --block takes ~10 s on SIGTERM
        try:
            os.killpg(node.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _session_alive(node.pid):
            time.sleep(0.2)
        if not _session_alive(node.pid):
            break
    node.wait(timeout=10)


def _session_alive(session_id: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session_id:
                    return True
            except (ProcessLookupError, PermissionError):
                continue
    return False


def wait_for_nodes(address: str, count: int, timeout_s: float = 120.0) -> None:
    import ray

    deadline = time.monotonic() + timeout_s
    ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        while sum(node["Alive"] for node in ray.nodes()) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Ray cluster at {address} has not {count} nodes after {timeout_s} s")
            time.sleep(0.5)
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """The address (127.0.0.1:port) of a running 2-node Ray cluster."""
    temp = Path(tempfile.mkdtemp(prefix="rray-"))  # short: Ray's socket paths must fit 107 bytes
    port = free_port()
    address = f"127.0.0.1:{port}"
    nodes = [start_node(["--head", "--port", str(port), "--num-cpus", "2", "--include-dashboard=false"],
                        temp / "head", temp / "head.log")]
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or nodes[0].poll() is not None:
                    raise RuntimeError(f"the Ray head did not start: {(temp / 'head.log').read_text()[-2000:]}") from None
                time.sleep(0.5)
        nodes.append(start_node(["--address", address, "--num-cpus", "1"], temp / "node2", temp / "node2.log"))
        wait_for_nodes(address, 2)
        yield address
    finally:
        for node in reversed(nodes):
            stop_node(node)
        shutil.rmtree(temp, ignore_errors=True)
