"""Files, snapshots and the wipe of a docker sandbox: what goes in and out of its /work tmpfs.

`docker cp`/`put_archive` would write under the tmpfs, not into it, so everything goes
over an exec's stdin and stdout, done in the container by programs/docker_work.py (sent as
text, WORK_PROGRAM) as the sandbox user:
- `write_files`: framed bytes in, unpacked under /work (after the deferred wipe, in the
  same exec); `read_file`: one file out, at most `Limits.disk_mb` of it;
- `snapshot()`: a tar of /work streamed, as it arrives, to a file on the host's disk
  (docker_snapshots.py), never held in this process's memory; sparse files are sparse
  members (their data only) and hard links links, so the file holds no more than /work
  does; a tar past `archive_cap` (more than /work can hold: not expected) or a /work the
  tar cannot read (modes or depth the sandboxed code left) is refused with AgentStateError,
  the agent's failure, not the host's; `restore()` empties /work and streams the file back;
- `reset()` defers the wipe of /work, /tmp, /dev/shm and /dev/mqueue to the next use.

`DockerWorkDir` holds the work dir's state (whether a wipe is due, the snapshot store) and
is handed what it needs of its sandbox's container as callables (`ContainerCalls`: run
by docker exec, run one of our programs, replace the container); DockerSandbox holds one and
passes its files-and-state calls to it.

What it does not do: start, replace or talk to the container itself (DockerSandbox does).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

from rlpipe.core.errors import AgentStateError, SandboxUnavailable
from rlpipe.sandbox.base import Limits, Snapshot
from rlpipe.sandbox.docker_snapshots import SnapshotStore, archive_cap
from rlpipe.sandbox.docker_stream import Capture, RawRun
from rlpipe.sandbox.programs import docker_work, program_source

# the file and state actions of docker_work.py, each sent as `python3 -I -S -c TEXT ACTION ARGS`
# (isolated: no module the agent left in /work, the cwd, is imported)
WORK_PROGRAM = program_source("programs/cleanup.py", "programs/extents.py", "programs/docker_work.py")
_WORK = WORK_PROGRAM
_WIPED_DIRS = ["/work", "/tmp", "/dev/shm", "/dev/mqueue"]


@dataclass(frozen=True)
class ContainerCalls:
    """What the work dir needs of its sandbox's container (DockerSandbox's methods)."""

    run: Callable[..., RawRun]  # (argv, stdin, timeout_s, cap_bytes, capture=None): one docker exec
    ours: Callable[[str, list[str], bytes, float], RawRun]  # a program of sandbox/programs/, warm if it can be
    replace_container: Callable[[], None]  # a fresh container: the work dir is lost


class DockerWorkDir:
    """The /work of one docker sandbox: files in and out, snapshots, the deferred wipe."""

    def __init__(self, container: ContainerCalls, limits: Limits, snapshots: SnapshotStore) -> None:
        self._container = container
        self.limits = limits
        self.snapshots = snapshots
        self.needs_wipe = False  # reset() defers the wipe to the next use

    def write_files(self, files: dict[str, bytes]) -> None:
        """Write files under /work (parents created, existing files replaced) in one exec, or one
        request to the warm server when it runs."""
        frames = docker_work.frames({_checked_relative(path): data for path, data in files.items()})
        wipe_first = _WIPED_DIRS if self.needs_wipe else []
        raw = self._container.ours(_WORK, ["unpack", *wipe_first], frames, 60.0)
        if raw.exit_code not in (0, docker_work.PATH_REFUSED) and wipe_first:  # the wipe failed: a fresh container
            self._container.replace_container()
            raw = self._container.run(["python3", "-I", "-S", "-c", _WORK, "unpack"], frames, 60.0, 4096)
        self.needs_wipe = False
        if raw.exit_code == docker_work.PATH_REFUSED:  # e.g. stats.py/x where stats.py is a file: the caller's error
            raise OSError(f"the work dir refused the write: {raw.stderr[-300:].decode(errors='replace').strip()}")
        if raw.exit_code != 0:
            raise SandboxUnavailable(f"docker sandbox could not write files: {raw.stderr[-500:].decode(errors='replace')}",
                                     hint="the files may not fit in the work dir (Limits.disk_mb)")

    def read_file(self, path: str) -> bytes:
        self.wipe_if_needed()
        most = self.limits.disk_mb * 1024 * 1024  # what bwrap's read_file returns at most, too
        argv = ["python3", "-I", "-S", "-c", _WORK, "cat", "/work/" + _checked_relative(path), str(most)]
        raw = self._container.run(argv, b"", 60.0, None)
        if raw.exit_code != 0:
            raise FileNotFoundError(f"{path} cannot be read in the sandbox: {raw.stderr[-300:].decode(errors='replace')}")
        return raw.stdout

    def snapshot(self) -> Snapshot:
        """A tar of /work, streamed to a file on the host's disk (docker_snapshots.py), never held in
        memory; AgentStateError when /work cannot be read or its tar passes `archive_cap`."""
        self.wipe_if_needed()
        snapshot = Snapshot(snapshot_id=uuid.uuid4().hex)
        path = self.snapshots.new_path(snapshot.snapshot_id)
        cap = archive_cap(self.limits.disk_mb)
        with open(path, "wb") as archive:
            capture = Capture(4096, stdout_file=archive, stdout_file_cap=cap)
            raw = self._container.run(["python3", "-I", "-S", "-c", _WORK, "tar"], b"", 60.0, 4096, capture)
        if raw.exit_code == 0 and not capture.overflowed:
            self.snapshots.keep(snapshot.snapshot_id)
            return snapshot
        path.unlink(missing_ok=True)
        if capture.overflowed:
            raise AgentStateError(f"the work dir's snapshot passed {cap // (1024 * 1024)} MiB (its disk limit of "
                                  f"{self.limits.disk_mb} MB and tar headers); refused to copy it",
                                  hint="the sandboxed code left more in /work than its disk limit allows")
        why = raw.stderr[-500:].decode(errors="replace").strip()
        if raw.exit_code == docker_work.TREE_UNREADABLE:
            raise AgentStateError(f"the work dir cannot be snapshot: {why}",
                                  hint="the sandboxed code left files or dirs that cannot be read (modes, depth)")
        raise SandboxUnavailable(f"docker sandbox could not snapshot /work: {why or 'timed out'}",
                                 hint="the container may be gone; check `docker info`")

    def restore(self, snapshot: Snapshot) -> None:
        """Empty /work, then stream the snapshot's tar from the host's disk into it."""
        path = self.snapshots.path(snapshot.snapshot_id)
        self.needs_wipe = True
        self.wipe_if_needed()
        with open(path, "rb") as archive:
            raw = self._container.run(["python3", "-I", "-S", "-c", _WORK, "untar"], archive, 60.0, 4096)
        if raw.exit_code != 0:
            raise SandboxUnavailable(f"docker sandbox could not restore /work: {raw.stderr[-500:].decode(errors='replace')}",
                                     hint="the work dir may be full (Limits.disk_mb) or the container gone")

    def reset(self) -> None:
        """Back to an empty /work, /tmp and /dev/shm. No process is left to kill (each command's
        wrapper, or the warm server after each request, killed them), so the wipe is deferred:
        the next write_files does it in the same exec, anything else first runs it on its own
        (one docker exec saved per pool use). The warm server, which holds no file, stays, and
        serves the wipe and write_files while it runs (a fork instead of a docker exec)."""
        self.needs_wipe = True

    def wipe_if_needed(self) -> None:
        """Run the deferred wipe now, if one is due (a fresh container if the wipe fails)."""
        if not self.needs_wipe:
            return
        try:
            raw = self._container.ours(_WORK, ["wipe", *_WIPED_DIRS], b"", 30.0)
            if raw.exit_code != 0:
                self._container.replace_container()
        except SandboxUnavailable:
            self._container.replace_container()
        self.needs_wipe = False


def _checked_relative(path: str) -> str:
    relative = PurePosixPath(path)
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise ValueError(f"sandbox paths are relative to the work dir and stay inside it: {path!r}")
    return str(relative)
