"""Where the docker backend keeps a sandbox's snapshots: tar files on the host's disk, bounded.

`docker commit` does not see tmpfs mounts, so a snapshot is a tar stream of /work made in
the container (programs/docker_work.py: sparse files as sparse members, hard links as
links) and written, as it arrives, to a file of this store; a restore streams it back. This
process never holds a snapshot in memory, and a file may not pass `archive_cap(disk_mb)`:
the data /work can hold plus room for tar's headers (the /work tmpfs has at most
`work_inodes(disk_mb)` inodes, each at most a few 512-byte blocks of headers).

Each sandbox's store is a dir `<pid>-<start ticks>-<random>` under `SNAPSHOT_ROOT`; `close()`
removes it, and `remove_leaked_snapshot_dirs` removes those whose process is gone (a crashed
or killed run), the way docker_owners.py removes its containers.

What it does not do: make or unpack the tar (the container does), or check its content.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

from rlpipe.sandbox.owner import process_alive, this_process

SNAPSHOT_ROOT = Path(tempfile.gettempdir()) / f"rlpipe-docker-snapshots-{os.getuid()}"
_HEADER_BYTES_PER_INODE = 3 * 512  # a pax record block, the header block, a partial last data block


def work_inodes(disk_mb: int) -> int:
    """The inode limit of a /work tmpfs of disk_mb (the bubblewrap backend's rule too)."""
    return max(4096, disk_mb * 64)


def archive_cap(disk_mb: int) -> int:
    """The largest tar of a /work of disk_mb: its data, and the headers of every inode it can hold."""
    return disk_mb * 1024 * 1024 + work_inodes(disk_mb) * _HEADER_BYTES_PER_INODE + 1024 * 1024


class SnapshotStore:
    """One sandbox's snapshot files, in a dir of its own made on first use."""

    def __init__(self, root: Path = SNAPSHOT_ROOT) -> None:
        self.root = root
        self._dir: Path | None = None
        self._ids: set[str] = set()

    @property
    def dir(self) -> Path:
        if self._dir is None:
            self.root.mkdir(mode=0o700, exist_ok=True)
            pid, ticks = this_process()
            self._dir = self.root / f"{pid}-{ticks}-{uuid.uuid4().hex[:8]}"
            self._dir.mkdir(mode=0o700)
        return self._dir

    def new_path(self, snapshot_id: str) -> Path:
        """The file to write snapshot `snapshot_id` to (kept once `keep` is called)."""
        return self.dir / f"{snapshot_id}.tar"

    def keep(self, snapshot_id: str) -> None:
        self._ids.add(snapshot_id)

    def path(self, snapshot_id: str) -> Path:
        """The file of a kept snapshot; KeyError for one this store did not take."""
        if snapshot_id not in self._ids:
            raise KeyError(f"snapshot {snapshot_id} was not taken by this sandbox")
        return self.dir / f"{snapshot_id}.tar"

    def clear(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None
        self._ids.clear()


def remove_leaked_snapshot_dirs(root: Path = SNAPSHOT_ROOT) -> int:
    """Remove the snapshot dirs whose owning process is gone; how many."""
    if not root.is_dir():
        return 0
    removed = 0
    for directory in root.iterdir():
        pid_text, _, rest = directory.name.partition("-")
        ticks = rest.partition("-")[0]
        if pid_text.isdigit() and ticks and process_alive(int(pid_text), ticks):
            continue
        shutil.rmtree(directory, ignore_errors=True)
        removed += 1
    return removed
