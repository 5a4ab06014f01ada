"""Host-side file access to a sandbox's work dir that sandboxed code cannot redirect.

The host process (often root) reads and writes files in a directory that untrusted code
controls. Every path is walked one component at a time with O_NOFOLLOW, so a symlink
planted in the work dir (`out.txt -> /root/.ssh/id_rsa`) is refused instead of followed,
and only regular files are read (a planted FIFO cannot block the host). Whole-tree copies
(snapshots) are tree_copy.py's.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path, PurePosixPath

from rlpipe.sandbox.owner import process_alive

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(relative_path: str) -> list[str]:
    path = PurePosixPath(relative_path)
    if path.is_absolute() or not path.parts or any(part in ("..", ".") for part in path.parts):
        raise ValueError(f"sandbox paths are relative to the work dir, without '..': {relative_path!r}")
    return list(path.parts)


def _open_parent(root: Path, parts: list[str], create: bool, uid: int | None) -> int:
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if uid is not None:
                        os.chown(part, uid, uid, dir_fd=fd, follow_symlinks=False)
                except FileExistsError:
                    pass
            next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_beneath(root: Path, relative_path: str, content: bytes, uid: int | None) -> None:
    """Write `content` to root/relative_path, never through a symlink; chown to `uid`."""
    parts = _parts(relative_path)
    parent_fd = _open_parent(root, parts, create=True, uid=uid)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        fd = os.open(parts[-1], flags, 0o644, dir_fd=parent_fd)
        with os.fdopen(fd, "wb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"{relative_path!r} in the sandbox is not a regular file")
            if uid is not None:
                os.fchown(fd, uid, uid)
            handle.write(content)
    finally:
        os.close(parent_fd)


def read_beneath(root: Path, relative_path: str, max_bytes: int) -> bytes:
    """Read root/relative_path (a regular file, reached without symlinks), at most `max_bytes`."""
    parts = _parts(relative_path)
    parent_fd = _open_parent(root, parts, create=False, uid=None)
    try:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent_fd)
    except OSError as exc:
        raise FileNotFoundError(f"{relative_path!r} is not a readable file in the sandbox ({exc.strerror})") from exc
    finally:
        os.close(parent_fd)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileNotFoundError(f"{relative_path!r} in the sandbox is not a regular file")
        return handle.read(max_bytes)


def owner_alive(owner_file: Path, grace_s: float = 60.0) -> bool:
    """Whether the process named in `owner_file` ("pid start_ticks") still runs.

    A missing owner file means the dir is being created: alive for `grace_s` after its mtime.
    """
    try:
        pid_text, ticks = owner_file.read_text().split()
    except (OSError, ValueError):
        try:
            return time.time() - owner_file.parent.stat().st_mtime < grace_s
        except OSError:
            return False
    return process_alive(int(pid_text), ticks)
