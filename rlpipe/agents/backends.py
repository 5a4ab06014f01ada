"""Sandboxes for trials: one backend name -> sandboxes with a task's quotas, the verifier's
sandbox, and which commands a backend's sandboxes have.

- bwrap: every exec has fresh namespaces and nothing outlives it; a snapshot can be restored
  in any sandbox of the same runtime root, so the verifier runs in a *new* sandbox restored
  from the agent's final snapshot.
- docker: snapshots are held by the sandbox that took them, so the verifier runs in the
  agent's own container, restored from the final snapshot; the backend kills every process
  of the sandbox user after each command (`kill -9 -1`), so nothing the agent started is
  left running when the tests are copied in.

`available_commands` asks a sandbox of the backend once per process (cached): bubblewrap
sees the host's /usr (bash, coreutils, git, make, ... where the host has them); the docker
image holds python3, sh and the shell tools of its TOOL_PACKAGES (rlpipe/sandbox/image.py).

`TrialBackend` is what a trial needs of a backend (open, verifier, available_commands);
`trial_backend(name, run_id)` gives the real one for bwrap or docker, and a test may pass its
own (e.g. one whose sandboxes die mid-trial) to run_trial. `run_id` (an eval's id) labels
every docker container the backend opens (`rlpipe.run_id`, docker_owners.py); bubblewrap
sandboxes have no labels and ignore it.

What it does not do: pool or pre-warm sandboxes (a trial owns its sandboxes).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from rlpipe.agents.task_format import TaskLimits
from rlpipe.core.errors import ConfigError
from rlpipe.sandbox.base import Limits, Sandbox, Snapshot, Workspace

BACKENDS = ("bwrap", "docker")
PROBE_TIMEOUT_S = 30.0


def sandbox_limits(limits: TaskLimits, timeout_s: float) -> Limits:
    """The sandbox Limits for a trial's quotas; `timeout_s` caps one command."""
    longest_s = max(limits.agent_timeout_s, limits.verifier_timeout_s)
    return Limits(timeout_s=timeout_s, memory_mb=limits.memory_mb, cpu_time_s=int(longest_s) + 1,
                  max_processes=256, disk_mb=limits.storage_mb, network=False)


def open_sandbox(backend: str, limits: Limits, cpus: float = 1.0, workspace: Workspace = Workspace(),
                 run_id: str | None = None) -> Sandbox:
    """A new sandbox (its work dir at `workspace.path` too, its image `workspace.image` on
    docker, a docker one labelled with `run_id`); SandboxUnavailable (an InfraError) when the
    backend cannot start one."""
    if backend == "docker":
        from rlpipe.sandbox.docker_backend import DockerSandbox

        return DockerSandbox(limits, cpus=cpus, workspace=workspace, run_id=run_id)
    if backend == "bwrap":
        from rlpipe.sandbox.bwrap import BwrapSandbox

        return BwrapSandbox(limits, workspace=workspace)  # CPU share is not limited per sandbox in bwrap (see docs/SANDBOX.md)
    raise ConfigError(f"unknown sandbox backend {backend!r}", hint=f"use one of {', '.join(BACKENDS)}")


def verifier_sandbox(backend: str, agent_sandbox: Sandbox, final: Snapshot, limits: Limits, cpus: float,
                     workspace: Workspace = Workspace(), run_id: str | None = None) -> tuple[Sandbox, bool]:
    """The sandbox the tests run in, holding the agent's final state; True when it is a new one
    (the caller closes it)."""
    if backend == "bwrap":
        fresh = open_sandbox(backend, limits, cpus, workspace, run_id)
        try:
            fresh.restore(final)
        except BaseException:
            fresh.close()
            raise
        return fresh, True
    agent_sandbox.restore(final)
    return agent_sandbox, False


@functools.cache
def _probe(backend: str, names: tuple[str, ...], workspace: Workspace) -> frozenset[str]:
    sandbox = open_sandbox(backend, Limits(timeout_s=PROBE_TIMEOUT_S), workspace=workspace)
    try:
        script = 'for name in "$@"; do command -v "$name" >/dev/null 2>&1 && echo "$name"; done; true'
        result = sandbox.exec(["sh", "-c", script, "probe", *names])
    finally:
        sandbox.close()
    return frozenset(result.stdout.split())


def available_commands(backend: str, names: Iterable[str], workspace: Workspace = Workspace()) -> frozenset[str]:
    """Which of `names` a sandbox of this backend (and workspace: a task's image, its PATH) can
    run (one probe per set of names and workspace)."""
    return _probe(backend, tuple(sorted(set(names))), workspace)


class TrialBackend(Protocol):
    """What a trial needs of a sandbox backend."""

    name: str

    def open(self, limits: Limits, cpus: float, workspace: Workspace = Workspace()) -> Sandbox: ...

    def verifier(self, agent_sandbox: Sandbox, final: Snapshot, limits: Limits, cpus: float,
                 workspace: Workspace = Workspace()) -> tuple[Sandbox, bool]: ...

    def available_commands(self, names: Iterable[str], workspace: Workspace = Workspace()) -> frozenset[str]: ...


@dataclass(frozen=True)
class NamedBackend:
    """The real backend `name` (bwrap or docker), through this module's functions; its docker
    containers are labelled with `run_id` (the eval's id) when there is one."""

    name: str
    run_id: str | None = None

    def open(self, limits: Limits, cpus: float, workspace: Workspace = Workspace()) -> Sandbox:
        return open_sandbox(self.name, limits, cpus, workspace, self.run_id)

    def verifier(self, agent_sandbox: Sandbox, final: Snapshot, limits: Limits, cpus: float,
                 workspace: Workspace = Workspace()) -> tuple[Sandbox, bool]:
        return verifier_sandbox(self.name, agent_sandbox, final, limits, cpus, workspace, self.run_id)

    def available_commands(self, names: Iterable[str], workspace: Workspace = Workspace()) -> frozenset[str]:
        return available_commands(self.name, names, workspace)


def trial_backend(backend: str | TrialBackend, run_id: str | None = None) -> TrialBackend:
    """A backend name -> the real backend (its containers labelled with `run_id`); a
    TrialBackend is returned as it is."""
    return NamedBackend(backend, run_id) if isinstance(backend, str) else backend
