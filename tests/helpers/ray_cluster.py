"""A throw-away Ray cluster on this machine, for tests/ray and benchmarks/ray_verify.py.

`local_ray_cluster(nodes_cpus=(2, 1))` starts a head (the first entry's CPUs) and one more
node per further entry, each `ray start ... --block` in a session of its own with its own
temp dir, and yields a LocalRayCluster (the head's address, 127.0.0.1:port; `stop()`). Stopping them signals that
session's processes only (SIGTERM, then SIGKILL): `ray stop` would stop every Ray of the
host. The object store is kept small (200 MB a node).

Ray 2.60 binds its nodes to the host's own address even when told 127.0.0.1
(`resolve_ip_for_localhost`): the traffic stays on this machine, over its own interface.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.ports import free_port

OBJECT_STORE_BYTES = 200_000_000
START_TIMEOUT_S = 120.0


def ray_command() -> str:
    return str(Path(sys.executable).with_name("ray"))


def start_node(args: list[str], temp_dir: Path, log: Path) -> subprocess.Popen:
    command = [ray_command(), "start", "--node-ip-address", "127.0.0.1", "--object-store-memory", str(OBJECT_STORE_BYTES),
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


def _wait_for_port(port: int, head: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or head.poll() is not None:
                raise RuntimeError(f"the Ray head did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.5)


def _wait_for_nodes(address: str, count: int) -> None:
    import ray

    deadline = time.monotonic() + START_TIMEOUT_S
    ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        while sum(node["Alive"] for node in ray.nodes()) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Ray cluster at {address} has not {count} nodes after {START_TIMEOUT_S} s")
            time.sleep(0.5)
    finally:
        ray.shutdown()


@dataclass
class LocalRayCluster:
    """A running cluster: its head's address and its nodes' `ray start --block` processes."""

    address: str
    nodes: list[subprocess.Popen] = field(default_factory=list)

    def stop(self) -> None:
        """Stop every node (the workers first); stopping twice does nothing."""
        while self.nodes:
            stop_node(self.nodes.pop())


@contextmanager
def local_ray_cluster(nodes_cpus: Sequence[int] = (2, 1)) -> Iterator[LocalRayCluster]:
    """A running Ray cluster of len(nodes_cpus) nodes on this machine, stopped on exit."""
    temp = Path(tempfile.mkdtemp(prefix="rray-"))  # short: Ray's socket paths must fit 107 bytes
    port = free_port()
    cluster = LocalRayCluster(f"127.0.0.1:{port}")
    head_args = ["--head", "--port", str(port), "--num-cpus", str(nodes_cpus[0]), "--include-dashboard=false"]
    cluster.nodes.append(start_node(head_args, temp / "head", temp / "head.log"))
    try:
        _wait_for_port(port, cluster.nodes[0], temp / "head.log")
        for index, cpus in enumerate(nodes_cpus[1:], start=1):
            cluster.nodes.append(start_node(["--address", cluster.address, "--num-cpus", str(cpus)],
                                            temp / f"node{index}", temp / f"node{index}.log"))
        _wait_for_nodes(cluster.address, len(nodes_cpus))
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(temp, ignore_errors=True)
