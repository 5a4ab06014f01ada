"""The Sandbox protocol and its records: what every isolation backend offers.

A backend runs commands in an isolated work dir and returns an ExecResult; it never
raises for anything the sandboxed code does (a crash, a timeout, an OOM, huge output are
all data in the ExecResult). It raises SandboxUnavailable (core.errors) only when the
backend itself cannot work (bwrap missing, docker daemon gone).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
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


WORK = "/work"
"""The work dir's own path in every sandbox (rlpipe's programs use it)."""
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/dev", "/sys", "/etc",
                "/tmp", "/tests", "/logs", "/run", "/var")


@dataclass(frozen=True)
class Workspace:
    """Where a task sees its work dir, what its commands' environment adds, which image runs it.

    `path`: the work dir is at /work and, when `path` differs, at `path` too (bubblewrap binds
    the same folder there; docker mounts the tmpfs there and the image's /work is a link to
    it): commands start in `path`. `env`: variables every command gets (a task's ENV lines;
    on docker the image's own ENV applies as well). `image`: docker only, the image to run
    (None: rlpipe's sandbox image).
    """

    path: str = WORK
    env: tuple[tuple[str, str], ...] = ()
    image: str | None = None


def workspace_problem(path: str) -> str:
    """Why `path` cannot be a work dir ('' when it can): absolute, normalised, not / and not in
    a system folder (those are the host's or the image's, read-only, or rlpipe's own)."""
    pure = PurePosixPath(path)
    if not pure.is_absolute() or ".." in pure.parts or str(pure) != path:
        return f"work dir {path!r} is not an absolute, normalised path"
    if path == WORK:
        return ""
    if path == "/" or path.startswith(WORK + "/") or any(path == top or path.startswith(top + "/") for top in _SYSTEM_DIRS):
        return f"work dir {path} is / or inside a system folder ({', '.join(_SYSTEM_DIRS)}, {WORK}) a sandbox cannot host it in"
    return ""


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
class VerifierRun:
    """What a task's tests did on a sandbox's state (`run_verifier`).

    `logs` holds the regular files the tests left in /logs/verifier (name -> bytes, each at
    most VERIFIER_LOG_BYTES), read by rlpipe only after the tests and every process they
    started were gone: nothing of the sandbox could change them after they were read.
    """

    result: ExecResult
    logs: dict[str, bytes]


VERIFIER_LOG_BYTES = 64 * 1024
"""The most of one /logs/verifier file `run_verifier` reads (a reward file is a few bytes)."""


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


class VerifierSandbox(Protocol):
    """A sandbox that can run a task's tests out of the reach of what ran in it before.

    `run_verifier(argv, tests, timeout_s)` runs `argv` (cwd /work) with:
    - `tests` (relative path -> bytes) at /tests, read-only to the command and written by
      rlpipe (not by a process of the sandbox), and an empty /logs/verifier and /logs/agent
      the command may write;
    - an environment of PATH, LANG, TMPDIR, HOME=/tmp (not /work: the agent's files hold no
      user site, .pth file or dotfile the tests would load) and PYTHONNOUSERSITE=1;
    - then, when the command and everything it started are gone, rlpipe reads the regular
      files of /logs/verifier itself (no symlink followed, VERIFIER_LOG_BYTES each) and
      removes /tests and /logs. Both backends implement it (bwrap.py, docker_backend.py).
    """

    def run_verifier(self, argv: list[str], tests: dict[str, bytes], timeout_s: float) -> VerifierRun: ...
