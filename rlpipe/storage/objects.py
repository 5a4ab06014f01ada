"""Bytes in and out of a lake's filesystem: whole small objects, listings, streamed files.

What it does: `ObjectStore` puts and gets whole objects (atomically: tmp file + fsync +
rename + folder fsync on disk; one PUT on S3), lists folders (hiding tmp files), and streams
a large file down to a local path with its digest (the algorithm it is asked for,
storage/digests.py). Storage failures become StorageUnavailable;
a missing object reads as None.

What it does not: know the lake's layout or records (storage/lake.py does).
"""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from rlpipe.core.errors import DiskFull, StorageUnavailable
from rlpipe.core.failpoints import failpoint
from rlpipe.storage.digests import new_hasher
from rlpipe.storage.filesystem import LakeLocation

CHUNK_BYTES = 8 * 1024 * 1024
TMP_PREFIX = ".tmp-"


@contextmanager
def storage_errors(action: str, location: LakeLocation) -> Iterator[None]:
    """Translate pyarrow/OS errors into StorageUnavailable (FileNotFoundError passes)."""
    try:
        yield
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        if is_disk_full(exc):
            raise disk_full(action, location) from exc
        raise StorageUnavailable(
            f"lake {location.uri}: {action} failed: {exc}",
            hint="check that the lake's disk or S3 endpoint is reachable; the step is retried",
        ) from exc


def is_disk_full(exc: BaseException) -> bool:
    """ENOSPC or EDQUOT, as OSError or as pyarrow's error text."""
    return getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(exc)


def disk_full(action: str, location: LakeLocation) -> DiskFull:
    """The one-line error of a full disk under the lake (what it was writing, what to do)."""
    where = f"the disk that holds {location.uri}" if location.is_local else f"the S3 storage of {location.uri}"
    return DiskFull(f"{where} is full: {action} failed (no space left on device)",
                    hint="free space there (or lower checkpoint.keep_last), then `rlpipe resume RUN`: it goes on from "
                    "the last committed step and removes the unfinished checkpoint folder")


class ObjectStore:
    """Objects addressed by lake-relative paths ("runs/r1/run.json")."""

    def __init__(self, location: LakeLocation) -> None:
        self.location = location
        self._fs = location.filesystem

    def put(self, relative: str, data: bytes, crash_point: str | None = None, durable: bool = True) -> None:
        """Write a whole object atomically. `crash_point` names a failpoint hit with half
        the bytes written (crash-recovery tests). `durable=False` (local disks): no fsync, for
        objects whose reader checks a digest and computes them again when they are lost or
        damaged (staged rows): a kill leaves them whole (the page cache keeps them), a power
        cut may not."""
        path = self.location.path(relative)
        with storage_errors(f"writing {relative}", self.location):
            if self.location.is_local:
                _atomic_local_write(Path(path), data, crash_point, durable)
            else:
                with self._fs.open_output_stream(path) as stream:
                    stream.write(data[: len(data) // 2])
                    if crash_point:
                        failpoint(crash_point)
                    stream.write(data[len(data) // 2 :])

    def get(self, relative: str) -> bytes | None:
        try:
            with storage_errors(f"reading {relative}", self.location):
                with self._fs.open_input_stream(self.location.path(relative)) as stream:
                    return stream.read()
        except FileNotFoundError:
            return None

    def list(self, relative: str, recursive: bool = False) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(self.location.path(relative), allow_not_found=True, recursive=recursive)
        with storage_errors(f"listing {relative}", self.location):
            infos = self._fs.get_file_info(selector)
        return [info for info in infos if not info.base_name.startswith(TMP_PREFIX)]

    def download(self, relative: str, local_path: Path, algorithm: str) -> str:
        """Copy `relative` to `local_path` (whole or not at all); its digest with `algorithm`
        (storage/digests.py)."""
        digest = new_hasher(algorithm)
        local_path.parent.mkdir(parents=True, exist_ok=True)
        partial = local_path.with_name(f"{TMP_PREFIX}{uuid.uuid4().hex}-{local_path.name}")
        with storage_errors(f"downloading {relative}", self.location):
            try:
                source_path = self.location.path(relative)
                with self._fs.open_input_stream(source_path) as source, open(partial, "wb") as target:
                    while chunk := source.read(CHUNK_BYTES):
                        digest.update(chunk)
                        target.write(chunk)
            except FileNotFoundError as exc:
                partial.unlink(missing_ok=True)
                raise StorageUnavailable(
                    f"lake {self.location.uri}: {relative} (listed in CHECKPOINT.json) is missing",
                    hint="the checkpoint is incomplete; load an older one",
                ) from exc
            os.replace(partial, local_path)
        return digest.hexdigest()


def _atomic_local_write(path: Path, data: bytes, crash_point: str | None = None, durable: bool = True) -> None:
    """Write to a tmp file in the same folder, fsync (if `durable`), rename over the target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # hidden and without the target's suffix: a process killed mid-write leaves a file that
    # no `*.parquet` glob (DuckDB, Spark, pyarrow datasets) reads as a truncated part
    partial = path.with_name(f"{TMP_PREFIX}{uuid.uuid4().hex}-{path.name}.partial")
    try:
        with open(partial, "wb") as stream:
            stream.write(data[: len(data) // 2])
            if crash_point:
                stream.flush()
                failpoint(crash_point)
            stream.write(data[len(data) // 2 :])
            stream.flush()
            if durable:
                os.fsync(stream.fileno())
        os.replace(partial, path)
        if not durable:
            return
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power cut
        finally:
            os.close(directory)
    finally:
        partial.unlink(missing_ok=True)
