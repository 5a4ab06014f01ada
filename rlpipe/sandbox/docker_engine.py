"""The docker engine a process talks to: one client per engine address, checked with a ping.

What it does not: start an engine (START_HINT says how) or run containers (docker_backend.py).
"""

from __future__ import annotations

import os
import threading

from rlpipe.core.errors import SandboxUnavailable

START_HINT = "start an engine: `dockerd > /tmp/dockerd.log 2>&1 &` (as root) or `systemctl start docker`"

_client_lock = threading.Lock()
_clients: dict[str | None, object] = {}


def docker_client(base_url: str | None = None):
    """One docker client per engine address and process (thread-safe), checked with a ping.

    `base_url` None means the environment's engine (DOCKER_HOST, else the local socket).
    Raises SandboxUnavailable, with how to start an engine, when none answers.
    """
    with _client_lock:
        if base_url not in _clients:
            try:
                import docker

                if base_url is None:
                    client = docker.from_env(timeout=60, max_pool_size=64)
                else:
                    client = docker.DockerClient(base_url=base_url, timeout=60, max_pool_size=64)
                client.ping()
            except Exception as exc:  # docker raises DockerException, requests errors, OSError
                where = base_url or os.environ.get("DOCKER_HOST", "the local socket")
                raise SandboxUnavailable(f"no docker engine answers at {where}: {exc}", hint=START_HINT) from exc
            _clients[base_url] = client
        return _clients[base_url]
