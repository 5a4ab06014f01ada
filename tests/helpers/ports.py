"""Free TCP ports on 127.0.0.1 for the tests' servers, chosen outside the kernel's ephemeral range.

A port from bind(("127.0.0.1", 0)) comes from the ephemeral range
(/proc/sys/net/ipv4/ip_local_port_range), which the kernel also hands to every outgoing
connection: between a test choosing such a port and its server binding it (seconds on a loaded
machine: `rlpipe up` starts MLflow after Prefect) another test's client may take it, and the server
fails with "address already in use" (seen on a fresh clone beside a busy core). A port below that
range is never handed out by the kernel: `free_port` draws one at random from a slice of its own
per xdist worker and checks it free with a bind.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

LOWEST = 20000  # above Ray's default worker ports (10002-19999), which tests/ray's clusters listen on
SLICES = 8  # xdist workers gw0..gw7 draw from disjoint slices (more workers share them)
_DRAWS = random.SystemRandom()  # no state a test's random.seed() could make repeat


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, below the ephemeral range."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    size = (_ephemeral_start() - LOWEST) // SLICES
    if size < 100:  # an unusual range setting: take the kernel's choice
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return int(probe.getsockname()[1])
    start = LOWEST + (int(worker) % SLICES if worker.isdigit() else 0) * size
    for _ in range(1000):
        port = _DRAWS.randrange(start, start + size)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue  # held by a server already
            return port
    raise RuntimeError(f"no free TCP port in {start}-{start + size - 1} on 127.0.0.1")
