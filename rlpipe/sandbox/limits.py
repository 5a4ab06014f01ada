"""Resource limits for sandboxed processes: cgroups where the host lets us, rlimits always.

Two layers, from strongest to weakest:

- cgroups (v2, or v1's `memory` and `pids` hierarchies): a memory limit on the whole process
  tree (RSS + tmpfs pages, no swap), a process-count limit, an OOM-kill counter, and
  "kill every process in the group". Used when this process may create child cgroups
  (root on a v1 host, or a delegated v2 subtree with `memory` and `pids` enabled).
- rlimits (set by util-linux `prlimit` on itself just before it execs bwrap): RLIMIT_CPU (CPU seconds,
  per process), RLIMIT_FSIZE (largest file), RLIMIT_NPROC (processes of the sandbox's uid),
  RLIMIT_CORE=0, and RLIMIT_AS (address space) when no memory cgroup exists.

What it does not do: limit CPU *share* (a sandbox may use a whole core; the pool bounds
concurrency instead), disk I/O bandwidth, or kernel memory outside the memory cgroup.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rlpipe.sandbox.base import Limits

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PREFIX = "rlpipe-"


@dataclass(frozen=True)
class CgroupLayout:
    """Where this host lets us create per-sandbox cgroups."""

    version: int  # 1 or 2
    memory_parent: Path
    pids_parent: Path


@dataclass
class SandboxCgroups:
    """The cgroup(s) of one sandbox: join, count OOM kills, kill all, remove."""

    layout: CgroupLayout
    memory_dir: Path
    pids_dir: Path

    @property
    def procs_files(self) -> list[Path]:
        dirs = [self.memory_dir] if self.memory_dir == self.pids_dir else [self.memory_dir, self.pids_dir]
        return [directory / "cgroup.procs" for directory in dirs]

    def add(self, pid: int) -> None:
        """Move `pid` (bwrap's child, before it runs the command) into the cgroup(s)."""
        for procs in self.procs_files:
            _write(procs, str(pid))

    def oom_kill_count(self) -> int:
        name = "memory.events" if self.layout.version == 2 else "memory.oom_control"
        try:
            for line in (self.memory_dir / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            pass
        return 0

    def pids(self) -> list[int]:
        found: set[int] = set()
        for procs in self.procs_files:
            try:
                found.update(int(line) for line in procs.read_text().split())
            except OSError:
                pass
        return sorted(found)

    def kill_all(self) -> None:
        if self.layout.version == 2 and (self.memory_dir / "cgroup.kill").exists():
            _write(self.memory_dir / "cgroup.kill", "1")
            return
        for _ in range(20):  # v1: no atomic kill; repeat until forks stop landing
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.002)

    def remove_soon(self) -> None:
        """Kill what is left now; remove the (then empty) dirs on a background thread.

        Removing a v1 memory cgroup takes milliseconds; a sandbox's close need not wait.
        Dirs left by an exit before the thread ran are empty and are reaped by name.
        """
        self.kill_all()
        _removals.put(self)
        with _removal_lock:
            global _removal_thread
            if _removal_thread is None or not _removal_thread.is_alive():
                _removal_thread = threading.Thread(target=_remove_forever, name="cgroup-removal", daemon=True)
                _removal_thread.start()

    def remove(self) -> None:
        self.kill_all()
        for directory in {self.memory_dir, self.pids_dir}:
            for _ in range(50):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


_removals: queue.SimpleQueue[SandboxCgroups] = queue.SimpleQueue()
_removal_lock = threading.Lock()
_removal_thread: threading.Thread | None = None


def _remove_forever() -> None:
    while True:
        _removals.get().remove()


def detect_cgroups() -> CgroupLayout | None:
    """The cgroup layout we may use here, or None (then only rlimits apply)."""
    own = _own_cgroup_paths()
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        parent = CGROUP_ROOT / own.get("", "/").lstrip("/")
        if _v2_delegated(parent):
            return CgroupLayout(version=2, memory_parent=parent, pids_parent=parent)
        return None
    memory_parent = CGROUP_ROOT / "memory" / own.get("memory", "/").lstrip("/")
    pids_parent = CGROUP_ROOT / "pids" / own.get("pids", "/").lstrip("/")
    for parent in (memory_parent, pids_parent):
        if not (parent / "cgroup.procs").exists() or not os.access(parent, os.W_OK):
            return None
    return CgroupLayout(version=1, memory_parent=memory_parent, pids_parent=pids_parent)


def create_cgroups(layout: CgroupLayout, name: str, limits: Limits, pids_cgroup: bool = True) -> SandboxCgroups | None:
    """Make the cgroup(s) for one sandbox; bwrap's child is moved in by pid (SandboxCgroups.add)."""
    memory_dir = layout.memory_parent / f"{CGROUP_PREFIX}{name}"
    # v1 moves a task into each hierarchy separately (milliseconds each); where RLIMIT_NPROC of a
    # per-sandbox uid already caps processes, the caller skips the pids hierarchy
    pids_dir = layout.pids_parent / f"{CGROUP_PREFIX}{name}" if pids_cgroup or layout.version == 2 else memory_dir
    memory_bytes = str(limits.memory_mb * 1024 * 1024)
    try:
        for directory in {memory_dir, pids_dir}:
            directory.mkdir(exist_ok=True)
        if layout.version == 2:
            _write(memory_dir / "memory.max", memory_bytes)
            _write(memory_dir / "memory.swap.max", "0", missing_ok=True)
        else:
            _write(memory_dir / "memory.limit_in_bytes", memory_bytes)
            _write(memory_dir / "memory.memsw.limit_in_bytes", memory_bytes, missing_ok=True)
        if pids_cgroup or layout.version == 2:
            _write(pids_dir / "pids.max", str(limits.max_processes))  # bwrap itself stays outside
    except OSError:
        SandboxCgroups(layout, memory_dir, pids_dir).remove()
        return None
    return SandboxCgroups(layout, memory_dir, pids_dir)  # joined by pid: SandboxCgroups.add


def remove_cgroups_named(layout: CgroupLayout | None, name: str) -> None:
    """Remove a leaked sandbox's cgroups (killing what is left in them)."""
    if layout is not None:
        memory_dir = layout.memory_parent / f"{CGROUP_PREFIX}{name}"
        SandboxCgroups(layout, memory_dir, layout.pids_parent / f"{CGROUP_PREFIX}{name}").remove()


def prlimit_argv(limits: Limits, memory_by_cgroup: bool) -> list[str]:
    """`prlimit ... --`: the rlimits that back (or, without cgroups, replace) the cgroup limits.

    util-linux `prlimit` sets them on itself, already running as the sandbox's uid, then
    execs bwrap (setting them on another uid's process would need CAP_SYS_RESOURCE, which
    containers often drop). RLIMIT_NPROC counts bwrap itself too, hence the + 1.
    """
    mib = 1024 * 1024
    argv = ["prlimit", f"--cpu={limits.cpu_time_s}", f"--fsize={limits.disk_mb * mib}",
            f"--nproc={limits.max_processes + 1}", "--core=0", "--nofile=1024"]
    if not memory_by_cgroup:
        argv.append(f"--as={limits.memory_mb * mib}")
    return [*argv, "--"]


def _own_cgroup_paths() -> dict[str, str]:
    """{controller: path} from /proc/self/cgroup ("" is the v2 unified hierarchy)."""
    paths: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _v2_delegated(parent: Path) -> bool:
    try:
        enabled = (parent / "cgroup.subtree_control").read_text().split()
        if not {"memory", "pids"} <= set(enabled):
            _write(parent / "cgroup.subtree_control", "+memory +pids")
        return os.access(parent, os.W_OK)
    except OSError:
        return False


def _write(path: Path, value: str, missing_ok: bool = False) -> None:
    try:
        path.write_text(value)
    except FileNotFoundError:
        if not missing_ok:
            raise
