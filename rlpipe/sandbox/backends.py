"""Pick a sandbox backend by name ("bwrap" or "docker"): a `Limits -> Sandbox` constructor and
the reaper of sandboxes that dead processes left behind.

The docker backend is imported only when asked for, so "bwrap" works where the docker SDK
or engine is missing. Not here: the backends themselves (bwrap.py, docker_backend.py) or
the pool (pool.py).
"""

from __future__ import annotations

from collections.abc import Callable

from rlpipe.core.errors import ConfigError
from rlpipe.sandbox.base import Limits, Sandbox

BACKENDS = ("bwrap", "docker")


def _check(backend: str) -> None:
    if backend not in BACKENDS:
        raise ConfigError(f"unknown sandbox backend {backend!r}", f"use one of {', '.join(BACKENDS)}")


def sandbox_constructor(backend: str) -> Callable[[Limits], Sandbox]:
    """A `limits -> Sandbox` constructor for the backend."""
    _check(backend)
    if backend == "docker":
        from rlpipe.sandbox.docker_backend import DockerSandbox

        return lambda limits: DockerSandbox(limits)
    from rlpipe.sandbox.bwrap import BwrapSandbox

    return lambda limits: BwrapSandbox(limits)


def reap_leaked(backend: str) -> int:
    """Remove the backend's sandboxes that dead processes of this host left behind; how many."""
    _check(backend)
    if backend == "docker":
        from rlpipe.sandbox.docker_backend import remove_leaked_containers

        return remove_leaked_containers()
    from rlpipe.sandbox.bwrap import reap_leaked_sandboxes

    return reap_leaked_sandboxes()
