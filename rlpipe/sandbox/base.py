"""The Sandbox protocol and its records: what every isolation backend offers.

A backend runs commands in an isolated work dir and returns an ExecResult; it never
raises for anything the sandboxed code does (a crash, a timeout, an OOM, huge output are
all data in the ExecResult). It raises SandboxUnavailable (core.errors) only when the
backend itself cannot work (bwrap missing, docker daemon gone).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox."""

    timeout_s: float = 10.0
    memory_mb: int = 512
    cpu_time_s: int = 30
    max_processes: int = 64
    disk_mb: int = 64
    output_bytes: int = 1_000_000
    network: bool = False


@dataclass(frozen=True)
class ExecResult:
    """What one command in a sandbox did."""

    exit_code: int | None  # None when killed before exiting on its own
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float
    timed_out: bool
    oom_killed: bool


@dataclass(frozen=True)
class Snapshot:
    """An opaque handle to a saved work state of one sandbox."""

    snapshot_id: str


class Sandbox(Protocol):
    """One isolated environment with a writable work dir (`/work` inside)."""

    def exec(self, argv: list[str], stdin: bytes = b"", timeout_s: float | None = None) -> ExecResult: ...

    def exec_python(self, code: str, stdin: bytes = b"", timeout_s: float | None = None,
                    args: Sequence[str] = ()) -> ExecResult:
        """The result `exec(["python3", "-I", "-S", "-c", code, *args], stdin, timeout_s)` would give.

        A backend may serve it faster (bubblewrap forks it from a warm interpreter); the
        isolation, limits and result fields are those of `exec`.
        """
        ...

    def write_files(self, files: dict[str, bytes]) -> None:
        """Write files (paths relative to the work dir) before a run."""
        ...

    def read_file(self, path: str) -> bytes: ...

    def snapshot(self) -> Snapshot: ...

    def restore(self, snapshot: Snapshot) -> None: ...

    def reset(self) -> None:
        """Back to an empty work dir (used by the pool between uses)."""
        ...

    def close(self) -> None: ...
