"""A bubblewrap sandbox's work dir on the host: made, emptied, given back its root, copied for snapshots.

As root the work dir is a tmpfs of `disk_mb` owned by the sandbox's host uid (files persist
across execs; a reset can remount it); otherwise a plain dir bounded only per file
(RLIMIT_FSIZE). Snapshots are copies of it under the runtime root's `snapshots/` made by
tree_copy.py: holes stay holes, hard links stay links, and a tree holding more data than
`disk_mb` is refused with AgentStateError (the partial copy removed), so a snapshot never
costs the host's disk more than the sandbox's own limit.

What it does not do: kill the processes that use the work dir, or decide when to reset
(bwrap.py does both).
"""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

from rlpipe.core.errors import AgentStateError, SandboxUnavailable
from rlpipe.sandbox.tree_copy import copy_tree

_MS_NOSUID, _MS_NODEV = 2, 4
_libc = ctypes.CDLL(None, use_errno=True)


def make_work_dir(work_dir: Path, host_uid: int, disk_mb: int, as_root: bool) -> bool:
    """A tmpfs of disk_mb as root (True); a plain dir (bounded per file only) where mounting is not allowed."""
    work_dir.mkdir(mode=0o700)
    if as_root:
        try:
            mount_work_tmpfs(work_dir, host_uid, disk_mb)
            return True
        except SandboxUnavailable:
            os.chown(work_dir, host_uid, host_uid)
    return False


def mount_work_tmpfs(work_dir: Path, host_uid: int, disk_mb: int, mode: int = 0o700) -> None:
    """A tmpfs of disk_mb (and disk_mb * 64 inodes) at `work_dir`, its root owned by host_uid."""
    inodes = max(4096, disk_mb * 64)
    options = f"size={disk_mb}m,nr_inodes={inodes},mode={mode:04o},uid={host_uid},gid={host_uid}"
    if _libc.mount(b"tmpfs", bytes(work_dir), b"tmpfs", _MS_NOSUID | _MS_NODEV, options.encode()) != 0:
        errno = ctypes.get_errno()
        raise SandboxUnavailable(f"cannot mount a tmpfs at {work_dir}: {os.strerror(errno)}",
                                 hint="run as root with CAP_SYS_ADMIN, or as a non-root user (plain work dir)")


def restore_work_root(work_dir: Path, host_uid: int, as_root: bool) -> None:
    """The work dir's own mode, owner, times and extended attributes (ACLs among them), as made."""
    for name in os.listxattr(work_dir, follow_symlinks=False):
        os.removexattr(work_dir, name, follow_symlinks=False)
    if as_root:
        os.chown(work_dir, host_uid, host_uid)
    os.chmod(work_dir, 0o700)
    os.utime(work_dir, ns=(0, 0))  # its times could carry bits to the next user


def empty_work_dir(work_dir: Path) -> None:
    for child in list(work_dir.iterdir()):
        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()


def save_snapshot(work_dir: Path, target: Path, disk_mb: int) -> None:
    """Copy the work dir to `target` (a new dir); AgentStateError, and no `target`, when it holds
    more than `disk_mb` of data."""
    try:
        copy_tree(work_dir, target, uid=None, budget_bytes=disk_mb * 1024 * 1024)
    except AgentStateError:
        shutil.rmtree(target, ignore_errors=True)
        raise


def load_snapshot(source: Path, work_dir: Path, host_uid: int, disk_mb: int) -> None:
    """Copy a snapshot into the (emptied) work dir, every entry owned by `host_uid`."""
    copy_tree(source, work_dir, uid=host_uid, budget_bytes=disk_mb * 1024 * 1024)
