"""A lake's checkpoint folders: written file by file straight to where they stay, committed
by CHECKPOINT.json and then LATEST, read back with their digests checked, and deleted.

    checkpoints/{run_id}/step={step:06d}/...              the files (rl/checkpoint_layout.py)
    checkpoints/{run_id}/step={step:06d}/CHECKPOINT.json  file list + sizes + digests, after them
    checkpoints/{run_id}/LATEST                           the highest complete step, written last

`CheckpointStore.begin` returns a `CheckpointWriting`: its `open(path)` is a stream to the
file's final place (a local lake: the file itself, written around the page cache with
O_DIRECT where the filesystem allows it, storage/direct_file.py, and fsynced when closed; S3: pyarrow's
multipart upload), digested as it is written (xxh3_128, storage/digests.py: a checkpoint
written before records sha256 and is checked with it), so a checkpoint's bytes go once and are never
staged in a temporary copy. Only `commit` makes the folder count: it writes CHECKPOINT.json
(atomically) and advances LATEST, which never moves back. A folder without CHECKPOINT.json is
partial (a kill or a failure during its write): nothing reads it, `abort` deletes it when the
write fails, and `remove_partial` deletes what a killed process left (the trainer calls it
when a run is resumed and before each save).

What it does not: decide what a checkpoint holds (rl/), when to save or which checkpoints to
keep (workers/checkpoint_writer.py, storage/checkpoint_retention.py).
"""

from __future__ import annotations

import mmap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import pyarrow.fs as pafs

from rlpipe.core.errors import LakeCorrupted
from rlpipe.core.failpoints import failpoint
from rlpipe.storage.digests import CHECKPOINT_DIGEST, new_hasher
from rlpipe.storage.direct_file import DirectFile, new_buffer
from rlpipe.storage.filesystem import LakeLocation
from rlpipe.storage.lake_records import CheckpointFile, CheckpointInfo
from rlpipe.storage.objects import ObjectStore, storage_errors

MARKER = "CHECKPOINT.json"


class _DigestingStream:
    """A write-only stream that counts and digests what passes through it."""

    def __init__(self, target, algorithm: str) -> None:
        self._target = target
        self.digest = new_hasher(algorithm)
        self.size_bytes = 0

    def write(self, data) -> int:
        self.digest.update(data)
        self._target.write(data)
        size = memoryview(data).nbytes
        self.size_bytes += size
        return size

    def flush(self) -> None:
        self._target.flush()


class CheckpointWriting:
    """One checkpoint being written: `open` its files, then `commit` (or `abort`)."""

    def __init__(self, store: CheckpointStore, run_id: str, step: int) -> None:
        self.store, self.run_id, self.step = store, run_id, step
        self.base = store.folder(run_id, step)
        self.files: list[CheckpointFile] = []
        self._began, self._began_cpu = time.monotonic(), time.thread_time()  # commit runs on this thread too
        self._bounce: mmap.mmap | None = None  # a local lake's O_DIRECT buffer, shared by the files

    @contextmanager
    def open(self, relative: str) -> Iterator[BinaryIO]:
        """A stream to the file `relative` of the folder; recorded (size, digest) once closed.
        The `checkpoint-write` failpoint is hit after each file's bytes (core/failpoints.py)."""
        location = self.store.location
        path = location.path(f"{self.base}/{relative}")
        with storage_errors(f"writing checkpoint file {self.base}/{relative}", location):
            if location.is_local:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                if self._bounce is None:
                    self._bounce = new_buffer()
                target = DirectFile(path, self._bounce)
                try:
                    stream = _DigestingStream(target, CHECKPOINT_DIGEST)
                    yield stream  # type: ignore[misc]
                    failpoint("checkpoint-write")
                    target.close()  # the tail, the size, fsync
                finally:
                    target.discard()
            else:
                with location.filesystem.open_output_stream(path) as target:
                    stream = _DigestingStream(target, CHECKPOINT_DIGEST)
                    yield stream  # type: ignore[misc]
                    failpoint("checkpoint-write")
        self.files.append(CheckpointFile.of(relative, stream.size_bytes, CHECKPOINT_DIGEST, stream.digest.hexdigest()))

    def commit(self) -> CheckpointInfo:
        """CHECKPOINT.json (the files written, sorted), then LATEST."""
        if not self.files:
            raise ValueError(f"checkpoint {self.base} has no files")
        info = CheckpointInfo(run_id=self.run_id, step=self.step, files=tuple(sorted(self.files, key=lambda file: file.path)),
                              saved_at_ms=int(time.time() * 1000), write_s=round(time.monotonic() - self._began, 3),
                              write_cpu_s=round(time.thread_time() - self._began_cpu, 3))
        self.store.objects.put(f"{self.base}/{MARKER}", info.to_json().encode())
        self.store.advance_latest(self.run_id, self.step)
        return info

    def abort(self) -> None:
        """Delete the partial folder (best effort: a failure here leaves it to remove_partial)."""
        try:
            self.store.delete(self.run_id, self.step)
        except Exception:  # noqa: BLE001 - the write's own error matters more
            pass


class CheckpointStore:
    """The checkpoint folders of one lake (Lake.checkpoints)."""

    def __init__(self, location: LakeLocation, objects: ObjectStore, check_name: Callable[[str, str], str]) -> None:
        self.location = location
        self.objects = objects
        self._fs = location.filesystem
        self._check_name = check_name

    def folder(self, run_id: str, step: int) -> str:
        return f"checkpoints/{self._check_name('run id', run_id)}/step={step:06d}"

    def begin(self, run_id: str, step: int) -> CheckpointWriting:
        """Start writing checkpoint `step` (a partial folder of that step is deleted first)."""
        if self.listed_steps(run_id).count(step) and not self.is_complete(run_id, step):
            self.delete(run_id, step)
        return CheckpointWriting(self, run_id, step)

    def save_folder(self, run_id: str, step: int, local_dir: Path) -> CheckpointInfo:
        """Copy every file under `local_dir` as checkpoint `step` and commit it. A step that
        already has a complete checkpoint keeps the stored one."""
        existing = self.info(run_id, step)
        if existing is not None:  # a retried save: the complete checkpoint stays as it is
            self.advance_latest(run_id, step)
            return existing
        local_files = sorted(p for p in Path(local_dir).rglob("*") if p.is_file())
        if not local_files:
            raise ValueError(f"checkpoint folder {local_dir} holds no files")
        writing = self.begin(run_id, step)
        for local_path in local_files:
            with open(local_path, "rb") as source, writing.open(local_path.relative_to(local_dir).as_posix()) as target:
                while chunk := source.read(8 * 1024 * 1024):
                    target.write(chunk)
        return writing.commit()

    def advance_latest(self, run_id: str, step: int) -> None:
        """LATEST holds the highest complete step: never move it backwards."""
        data = self.objects.get(f"checkpoints/{run_id}/LATEST")
        if data is None or int(data.decode().strip()) <= step:
            self.objects.put(f"checkpoints/{run_id}/LATEST", str(step).encode())

    def info(self, run_id: str, step: int) -> CheckpointInfo | None:
        data = self.objects.get(f"{self.folder(run_id, step)}/{MARKER}")
        return None if data is None else CheckpointInfo.from_json(data.decode())

    def is_complete(self, run_id: str, step: int) -> bool:
        return self.objects.get(f"{self.folder(run_id, step)}/{MARKER}") is not None

    def latest(self, run_id: str, at_or_before: int | None = None) -> int | None:
        """The newest complete checkpoint step (at or before a step when given), or None."""
        if at_or_before is None:
            data = self.objects.get(f"checkpoints/{self._check_name('run id', run_id)}/LATEST")
            if data is not None and self.is_complete(run_id, latest := int(data.decode().strip())):
                return latest
        for step in reversed(self.listed_steps(run_id)):
            if (at_or_before is None or step <= at_or_before) and self.is_complete(run_id, step):
                return step
        return None

    def steps(self, run_id: str) -> list[int]:
        """The steps of `run_id` that have a complete checkpoint (CHECKPOINT.json), ascending."""
        return [step for step in self.listed_steps(run_id) if self.is_complete(run_id, step)]

    def listed_steps(self, run_id: str) -> list[int]:
        """The steps with a checkpoint folder (complete or not), ascending."""
        return sorted(int(info.base_name.removeprefix("step=")) for info in self.objects.list(f"checkpoints/{self._check_name('run id', run_id)}")
                      if info.type == pafs.FileType.Directory and info.base_name.removeprefix("step=").isdigit())

    def remove_partial(self, run_id: str) -> list[int]:
        """Delete the folders without CHECKPOINT.json (a write killed or failed); their steps."""
        partial = [step for step in self.listed_steps(run_id) if not self.is_complete(run_id, step)]
        for step in partial:
            self.delete(run_id, step)
        return partial

    def delete(self, run_id: str, step: int) -> None:
        """Delete checkpoint `step`'s folder: CHECKPOINT.json first, so that a delete cut
        short leaves a partial folder (never read), not a complete one that lost files."""
        base = self.folder(run_id, step)
        with storage_errors(f"deleting checkpoint {base}", self.location):
            marker = self.location.path(f"{base}/{MARKER}")
            if self._fs.get_file_info(marker).type == pafs.FileType.File:
                self._fs.delete_file(marker)
            if self._fs.get_file_info(self.location.path(base)).type == pafs.FileType.Directory:
                self._fs.delete_dir(self.location.path(base))

    def load(self, run_id: str, step: int, local_dir: Path, only: Callable[[str], bool] | None = None) -> CheckpointInfo | None:
        """Download a complete checkpoint into `local_dir` (digests checked), or None; with
        `only`, the files whose path it accepts. LakeCorrupted names a listed file that is
        missing or altered."""
        base = self.folder(run_id, step)
        info = self.info(run_id, step)
        if info is None:
            return None
        files = [file for file in info.files if only is None or only(file.path)]
        paths = [self.location.path(f"{base}/{file.path}") for file in files]
        with storage_errors(f"checking the files of checkpoint {step}", self.location):
            found = self._fs.get_file_info(paths) if paths else []
        missing = [file.path for file, found_info in zip(files, found) if found_info.type != pafs.FileType.File]
        if missing:  # lost, not unreachable: a retry would not find them either
            raise LakeCorrupted(
                f"lake {self.location.uri}: checkpoint {base} lacks {', '.join(missing)} (listed in its CHECKPOINT.json)",
                hint="the lake lost checkpoint files; load an older one "
                "(latest_checkpoint(run_id, at_or_before=step - 1))",
            )
        for file in files:
            algorithm, expected = file.digest
            digest = self.objects.download(f"{base}/{file.path}", Path(local_dir) / file.path, algorithm)
            if digest != expected:
                raise LakeCorrupted(
                    f"lake {self.location.uri}: checkpoint file {base}/{file.path} has {algorithm} {digest}, "
                    f"expected {expected}",
                    hint="the checkpoint was altered; load an older one "
                    "(latest_checkpoint(run_id, at_or_before=step - 1))",
                )
        return info
