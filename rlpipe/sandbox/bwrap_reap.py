"""Sandboxes of the bubblewrap backend that dead processes left behind: found by owner, removed.

Each sandbox dir under the runtime root has an `owner` file ("pid start_ticks", owner.py);
`reap_leaked_sandboxes` removes the dirs (their tmpfs unmounted, cgroups removed,
snapshots deleted) whose owner no longer runs, and the cgroups whose sandbox dir is gone.
`cgroup_name` tags cgroups (host-wide) with the runtime root, so one root's reaper spares
another's.

What it does not do: touch a sandbox whose owner runs, or anything outside the runtime
root and its tagged cgroups.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
from pathlib import Path

from rlpipe.sandbox import limits as limits_module
from rlpipe.sandbox.bwrap_mounts import default_runtime_root
from rlpipe.sandbox.workdir import owner_alive

_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def reap_leaked_sandboxes(runtime_root: Path | None = None) -> int:
    """Remove sandbox dirs (and their tmpfs, cgroups, snapshots) whose owning process is gone."""
    root = runtime_root or default_runtime_root()
    if not root.is_dir():
        return 0
    layout = limits_module.detect_cgroups() if os.geteuid() == 0 else None
    reaped = 0
    for directory in root.iterdir():
        if directory.name in ("etc", "snapshots", "runtimes") or owner_alive(directory / "owner"):
            continue
        if os.geteuid() == 0:
            umount(directory / "work")
            for logs in directory.glob("verifier-*/logs"):  # a verifier's /logs tmpfs (bwrap_verifier.py)
                umount(logs)
        limits_module.remove_cgroups_named(layout, cgroup_name(root, directory.name))
        shutil.rmtree(directory, ignore_errors=True)
        for snapshot_dir in (root / "snapshots").glob(f"{directory.name}-*"):
            shutil.rmtree(snapshot_dir, ignore_errors=True)
        reaped += 1
    if layout is not None:  # cgroups whose removal thread never ran (the owner exited first)
        tag = cgroup_name(root, "")
        for parent in {layout.memory_parent, layout.pids_parent}:
            for cgroup_dir in parent.glob(f"{limits_module.CGROUP_PREFIX}{tag}*"):
                sandbox_name = cgroup_dir.name.removeprefix(limits_module.CGROUP_PREFIX + tag)
                if not (root / sandbox_name).exists():
                    limits_module.remove_cgroups_named(layout, tag + sandbox_name)
    return reaped


def cgroup_name(runtime_root: Path, sandbox_name: str) -> str:
    """Cgroups are host-wide: tag them with the runtime root so one root's reaper spares another's."""
    return f"{hashlib.sha256(str(runtime_root.resolve()).encode()).hexdigest()[:8]}-{sandbox_name}"


def umount(path: Path) -> None:
    """Detach the mount at `path` (nothing if none is there)."""
    _libc.umount2(bytes(path), _MNT_DETACH)
