"""Copy a work dir tree on the host, bounded: holes stay holes, hard links stay links, data has a budget.

The bubblewrap backend's snapshots and restores copy a sandbox's work dir (a tmpfs the
sandboxed code filled) to the host's disk and back. The code controls that tree, so the
copy must not cost more than the tree does:
- a sparse file (`truncate -s 64M f`: apparent size, no blocks) is copied extent by extent
  (programs/extents.py) and ends with the same apparent size and no more blocks than it had;
- files hard-linked together are copied once and linked again in the target (a file
  linked a thousand times is not a thousand copies);
- the data copied (the bytes of all extents) may not pass `budget_bytes`: past it the copy
  stops, the partial target is left for the caller to remove, and AgentStateError says so
  (the work dir's own limit holds the tree under the budget where it is a tmpfs of that size;
  a plain dir, where bwrap cannot mount one, is bounded only per file).
Symlinks are copied as symlinks (never followed); dirs keep their modes; devices, FIFOs and
sockets are skipped (not part of a work state).

What it does not do: keep owners (the caller's `uid` gets everything, or the copier keeps
them), times, or extended attributes; copy safely while the tree changes (no command runs
during a snapshot).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from rlpipe.core.errors import AgentStateError
from rlpipe.sandbox.programs.extents import data_extents


class _Budget:
    """Data bytes left to copy, and the first copy of each hard-linked inode."""

    def __init__(self, budget_bytes: int | None) -> None:
        self.limit = budget_bytes
        self.used = 0
        self.linked: dict[tuple[int, int], Path] = {}

    def spend(self, size: int, where: Path) -> None:
        self.used += size
        if self.limit is not None and self.used > self.limit:
            raise AgentStateError(
                f"the work dir holds more than {self.limit // (1024 * 1024)} MiB of data (the sandbox's disk limit); "
                f"refused to copy it (stopped at {where.name!r})",
                hint="the sandboxed code wrote more than its disk limit allows; this counts as its failure")


def copy_tree(source: Path, target: Path, uid: int | None, budget_bytes: int | None = None) -> None:
    """Copy dirs, regular files (sparse and hard links kept) and symlinks from source into target
    (created if missing); `uid` owns every copied entry (None: the copier). Raises AgentStateError
    when the data to copy passes `budget_bytes` (None: no budget), or when the tree's shape is one
    no copy can follow: deeper than MAX_DEPTH folders, or paths past the kernel's PATH_MAX."""
    try:
        _copy_dir(source, target, uid, _Budget(budget_bytes), 0)
    except OSError as exc:
        if exc.errno not in (errno.ENAMETOOLONG, errno.ELOOP):
            raise  # the host's doing (a full disk of the host, an I/O error): not the code's
        raise AgentStateError(f"the work dir holds a path too long to copy ({exc.strerror}: {str(exc.filename)[:120]}...)",
                              hint=_SHAPE_HINT) from None


MAX_DEPTH = 256
"""Folders nested deeper than this are not a work state: the copy stops (AgentStateError)
before its recursion could reach Python's limit."""
_SHAPE_HINT = "the sandboxed code built a tree that cannot be copied; this counts as its failure"


def _copy_dir(source: Path, target: Path, uid: int | None, budget: _Budget, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise AgentStateError(f"the work dir nests folders more than {MAX_DEPTH} deep; refused to copy it",
                              hint=_SHAPE_HINT)
    target.mkdir(mode=0o755, exist_ok=True)
    for entry in os.scandir(source):
        source_path, target_path = Path(entry.path), target / entry.name
        status = entry.stat(follow_symlinks=False)
        mode = status.st_mode
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(source_path), target_path)
        elif stat.S_ISDIR(mode):
            _copy_dir(source_path, target_path, uid, budget, depth + 1)
            os.chmod(target_path, stat.S_IMODE(mode))
        elif stat.S_ISREG(mode):
            inode = (status.st_dev, status.st_ino)
            if status.st_nlink > 1 and inode in budget.linked:
                os.link(budget.linked[inode], target_path)
                continue  # the first copy has its owner already
            _copy_file(source_path, target_path, stat.S_IMODE(mode), budget)
            if status.st_nlink > 1:
                budget.linked[inode] = target_path
        else:
            continue  # FIFOs, sockets, devices: not part of a work state
        if uid is not None:
            os.chown(target_path, uid, uid, follow_symlinks=False)


def _copy_file(source: Path, target: Path, mode: int, budget: _Budget) -> None:
    """Copy the data extents of source into a new file target of the same apparent size."""
    source_fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        target_fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            size = os.fstat(source_fd).st_size
            for start, length in data_extents(source_fd, size):
                budget.spend(length, source)
                os.lseek(target_fd, start, os.SEEK_SET)
                offset, end = start, start + length
                while offset < end:
                    sent = os.sendfile(target_fd, source_fd, offset, end - offset)
                    if sent == 0:
                        break  # the file shrank under us
                    offset += sent
            os.ftruncate(target_fd, size)  # the trailing hole, if any
        finally:
            os.close(target_fd)
    finally:
        os.close(source_fd)
