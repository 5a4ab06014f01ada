"""A task's tests on a bubblewrap sandbox's state, out of the reach of what ran there before.

`run_verifier(sandbox, argv, tests, timeout_s)` (BwrapSandbox.run_verifier):

    1. a fresh host folder (mkdtemp, in the sandbox's own host folder) holds `tests/`, written
       by this process, and `logs/verifier`, `logs/agent`, owned by the sandbox's uid, on a
       tmpfs of the sandbox's disk limit where the work dir is one (as root; the tests run the
       agent's code, which may write there);
    2. one exec with those bound at /tests (read-only) and /logs (read-write), /proc
       read-only (no process writes another's memory through /proc/PID/mem), the tests
       runtime (tests_runtime.py: pytest, uvx and uv shims; a host copy made once per runtime
       root) read-only at /.rlpipe-tests and first on PATH and PYTHONPATH, HOME=/tmp (a
       tmpfs that is new each exec) and PYTHONNOUSERSITE=1: no file of the agent's /work is a
       user site, .pth or dotfile of the tests' processes;
    3. when the exec has returned, its pid namespace is gone and everything in it dead (the
       command was the namespace's pid 1): the regular files of logs/verifier are read here,
       by this process, through file descriptors that follow no symlink, at most
       VERIFIER_LOG_BYTES each; then the folder is removed.

What it does not: choose the command or interpret the reward (agents/verifier.py), or keep
the tests secret from the processes the tests themselves start (they run with the tests'
uid and can read /tests: a check must compare what it computes itself, see docs/AGENTS.md).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from collections.abc import Callable, Sequence

from rlpipe.sandbox.base import VERIFIER_LOG_BYTES, ExecResult, VerifierRun
from rlpipe.sandbox.bwrap_reap import umount
from rlpipe.sandbox.bwrap_workdir import mount_work_tmpfs
from rlpipe.sandbox.tests_runtime import RUNTIME_PATH, host_runtime, verifier_argv
from rlpipe.sandbox.workdir import write_beneath

ExecWithMounts = Callable[[list[str], float, Sequence[str]], ExecResult]
"""BwrapSandbox.exec_with_mounts: (argv, timeout_s, more bwrap arguments) -> the result."""

MAX_LOG_FILES = 32
"""/logs/verifier files read at most (a reward file or two; the rest is the tests' own logs)."""
REWARD_FILES = ("reward.txt", "reward.json")
"""Read before any other file of /logs/verifier (agents/verifier.py reads the reward from them)."""


def run_verifier(exec_with_mounts: ExecWithMounts, sandbox_dir: Path, sandbox_uid: int, runtime_root: Path,
                 argv: list[str], tests: dict[str, bytes], timeout_s: float, logs_mb: int | None = None) -> VerifierRun:
    """Run argv as the module docstring says, in the sandbox whose host folder is `sandbox_dir`,
    whose processes run as host uid `sandbox_uid`, with the tests runtime kept under `runtime_root`;
    /logs a tmpfs of `logs_mb` (None: a plain folder, bounded per file only)."""
    root = Path(tempfile.mkdtemp(prefix="verifier-", dir=sandbox_dir))
    logs_dir = root / "logs"
    mounted = False
    try:
        os.chmod(root, 0o711)
        tests_dir = root / "tests"
        tests_dir.mkdir(mode=0o755)
        for path, data in tests.items():
            write_beneath(tests_dir, path, data, uid=None)
        _open_up(tests_dir)
        logs_dir.mkdir(mode=0o755)
        if logs_mb is not None:  # the checked code writes /logs/agent too: the host's disk is not its to fill
            mount_work_tmpfs(logs_dir, 0, logs_mb, mode=0o755)
            mounted = True
        for name in ("verifier", "agent"):
            (logs_dir / name).mkdir(mode=0o755)
            os.chown(logs_dir / name, sandbox_uid, sandbox_uid)
        runtime = host_runtime(runtime_root)
        extra = ["--remount-ro", "/proc",  # no process of the tests writes another's memory through /proc/PID/mem
                 "--ro-bind", str(tests_dir), "/tests", "--bind", str(logs_dir), "/logs", "--ro-bind", str(runtime), RUNTIME_PATH,
                 "--setenv", "HOME", "/tmp", "--setenv", "PYTHONNOUSERSITE", "1"]
        result = exec_with_mounts(verifier_argv(argv), timeout_s, extra)
        return VerifierRun(result, read_logs(logs_dir / "verifier"))
    finally:
        if mounted:
            umount(logs_dir)
        shutil.rmtree(root, ignore_errors=True)


def _open_up(tests_dir: Path) -> None:
    """Tests readable and runnable by the sandbox's uid, writable by none of its processes."""
    for folder, _, files in os.walk(tests_dir):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o755)


def read_logs(folder: Path) -> dict[str, bytes]:
    """The files directly in `folder` (which a sandbox process could write), at most
    VERIFIER_LOG_BYTES of each and MAX_LOG_FILES of them, reward.txt and reward.json first
    (no number of other files can push them out). No symlink is followed (the folder's own
    path included); an entry that is not a regular file (a symlink, folder, FIFO, device) is
    listed with no content, so a reward.txt that is not a file reads as no reward rather than
    as absent (which would let a reward.json beside it count)."""
    try:
        folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    logs: dict[str, bytes] = {}
    try:
        names = os.listdir(folder_fd)
        first = [name for name in REWARD_FILES if name in names]
        for name in first + sorted(set(names) - set(first))[:MAX_LOG_FILES - len(first)]:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd)
            except OSError:
                logs[name] = b""  # a symlink (ELOOP), or gone
                continue
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder opens too; fdopen would raise on it
                os.close(fd)
                logs[name] = b""
                continue
            with os.fdopen(fd, "rb") as handle:
                logs[name] = handle.read(VERIFIER_LOG_BYTES)
    finally:
        os.close(folder_fd)
    return logs
