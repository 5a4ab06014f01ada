"""The lake: run documents, Parquet trajectory parts, step manifests and checkpoints.

Layout under the root (a folder or s3://bucket/prefix):

    runs/{run_id}/run.json                         RunInfo
    runs/{run_id}/status.json                      RunStatus (overwritten as the run moves)
    runs/{run_id}/steps/{step:06d}/MANIFEST.json   StepManifest, written LAST for the step
    trajectories/run_id={run_id}/step={step}/part-{name}.parquet   immutable, zstd
    checkpoints/{run_id}/step={step:06d}/...       the files of a local folder
    checkpoints/{run_id}/step={step:06d}/CHECKPOINT.json   file list + digests, after the files
    checkpoints/{run_id}/LATEST                    the highest complete step, written last
    staging/run_id={run_id}/step={step}/{stage}-{digest}.parquet   rows passed between stages
    runs/{run_id}/{document}.json                  small JSON documents (evaluations, ...)

What it guarantees: a step is committed iff its manifest exists, and readers reach parts
only through manifests, so a part orphaned by a crash is never read. Every document is
written atomically (tmp file + fsync + rename on disk; one PUT on S3). Writing the same part
twice is harmless: the caller picks a deterministic name, and the bytes are the same.
Staged rows (the hand-over between stages inside a step) are content-addressed, so a
reference to them never changes meaning; they sit outside trajectories/ and are never
queried.
Re-committing a step keeps the first manifest (and so its metric timestamps). Storage
failures raise StorageUnavailable (an InfraError: retried); a missing document reads as None.

What it does not: lock against two writers committing the same step at once (one run has
one controller), garbage-collect orphans, or know about MLflow or Prefect.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rlpipe.core.errors import ConfigError, StorageUnavailable
from rlpipe.core.records import Trajectory
from rlpipe.storage.filesystem import LakeLocation, open_lake_location
from rlpipe.storage.lake_records import (
    CheckpointFile,
    CheckpointInfo,
    PartRef,
    RunInfo,
    RunStatus,
    StepManifest,
)
from rlpipe.storage.schema import TRAJECTORY_SCHEMA, from_table, to_table

_STAGED_PATTERN = re.compile(r"^staging/run_id=[A-Za-z0-9][A-Za-z0-9._-]*/step=\d+/[A-Za-z0-9._-]+-[0-9a-f]{16}\.parquet$")
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CHUNK_BYTES = 8 * 1024 * 1024


def _check_name(kind: str, value: str) -> str:
    if not _NAME_PATTERN.match(value):
        raise ConfigError(
            f"{kind} {value!r} cannot be used in lake paths",
            hint="use letters, digits, '.', '_' and '-' (at most 128, not starting with '.')",
        )
    return value


def _now_ms() -> int:
    return int(time.time() * 1000)


@contextmanager
def _storage_errors(action: str, location: LakeLocation) -> Iterator[None]:
    """Translate pyarrow/OS errors into StorageUnavailable (FileNotFoundError passes)."""
    try:
        yield
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise StorageUnavailable(
            f"lake {location.uri}: {action} failed: {exc}",
            hint="check that the lake's disk or S3 endpoint is reachable; the step is retried",
        ) from exc


class Lake:
    """Reads and writes one lake. Build with `Lake.open(uri, ...)` or `Lake(location)`."""

    def __init__(self, location: LakeLocation) -> None:
        self.location = location
        self._fs = location.filesystem

    @staticmethod
    def open(
        uri: str,
        endpoint_url: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str | None = None,
    ) -> Lake:
        return Lake(open_lake_location(uri, endpoint_url, access_key, secret_key, region))

    @property
    def uri(self) -> str:
        return self.location.uri

    # -- runs -------------------------------------------------------------------------------

    def write_run_info(self, info: RunInfo) -> None:
        self._put(f"runs/{_check_name('run id', info.run_id)}/run.json", info.to_json().encode())

    def read_run_info(self, run_id: str) -> RunInfo | None:
        data = self._get(f"runs/{_check_name('run id', run_id)}/run.json")
        return None if data is None else RunInfo.from_json(data.decode())

    def list_runs(self, require_info: bool = True) -> list[str]:
        """Run ids that have a run.json (any folder under runs/ when not `require_info`), sorted."""
        candidates = [info.base_name for info in self._list("runs") if info.type == pafs.FileType.Directory]
        if not require_info:
            return sorted(candidates)
        paths = [self.location.path(f"runs/{run_id}/run.json") for run_id in candidates]
        with _storage_errors("listing runs", self.location):
            infos = self._fs.get_file_info(paths) if paths else []
        return sorted(run_id for run_id, info in zip(candidates, infos) if info.type == pafs.FileType.File)

    def write_status(self, status: RunStatus) -> None:
        self._put(f"runs/{_check_name('run id', status.run_id)}/status.json", status.to_json().encode())

    def read_status(self, run_id: str) -> RunStatus | None:
        data = self._get(f"runs/{_check_name('run id', run_id)}/status.json")
        return None if data is None else RunStatus.from_json(data.decode())

    # -- trajectories and manifests ----------------------------------------------------------

    def write_part(self, run_id: str, step: int, name: str, trajectories: list[Trajectory]) -> PartRef:
        """Write one immutable Parquet part; the same (run_id, step, name, rows) -> same bytes."""
        relative = (
            f"trajectories/run_id={_check_name('run id', run_id)}/step={step}/"
            f"part-{_check_name('part name', name)}.parquet"
        )
        data = _parquet_bytes(trajectories)
        self._put(relative, data)
        return PartRef(path=relative, rows=len(trajectories), sha256=hashlib.sha256(data).hexdigest())

    def read_parts(self, parts: tuple[PartRef, ...] | list[PartRef]) -> list[Trajectory]:
        """The rows of the parts, in order; StorageUnavailable if one is missing or altered."""
        return from_table(self.read_parts_table(parts))

    def read_parts_table(self, parts: tuple[PartRef, ...] | list[PartRef]) -> pa.Table:
        """Like read_parts, as one Arrow table with TRAJECTORY_SCHEMA."""
        tables = [TRAJECTORY_SCHEMA.empty_table()]
        for part in parts:
            data = self._get(part.path)
            if data is None:
                raise StorageUnavailable(
                    f"lake {self.uri}: part {part.path} listed in a manifest is missing",
                    hint="the lake lost a committed file; restore it or delete the step's manifest",
                )
            digest = hashlib.sha256(data).hexdigest()
            if digest != part.sha256:
                raise StorageUnavailable(
                    f"lake {self.uri}: part {part.path} has sha256 {digest}, manifest says {part.sha256}",
                    hint="the file was altered after commit; restore it or delete the step's manifest",
                )
            tables.append(pq.read_table(pa.BufferReader(data)).select(TRAJECTORY_SCHEMA.names).cast(TRAJECTORY_SCHEMA))
        return pa.concat_tables(tables)

    def commit_step(self, manifest: StepManifest) -> StepManifest:
        """Commit a step by writing its manifest last. If the step is already committed,
        keep the stored manifest and return it (a retry sees the first commit's timestamp)."""
        existing = self.read_manifest(manifest.run_id, manifest.step)
        if existing is not None:
            return existing
        if manifest.rows != sum(part.rows for part in manifest.parts):
            raise ValueError(f"manifest rows {manifest.rows} != sum of part rows of step {manifest.step}")
        paths = [self.location.path(part.path) for part in manifest.parts]
        with _storage_errors(f"checking the parts of step {manifest.step}", self.location):
            infos = self._fs.get_file_info(paths) if paths else []
        missing = [part.path for part, info in zip(manifest.parts, infos) if info.type != pafs.FileType.File]
        if missing:
            raise ValueError(f"cannot commit step {manifest.step}: parts not written: {missing}")
        self._put(self._manifest_path(manifest.run_id, manifest.step), manifest.to_json().encode())
        return manifest

    def read_manifest(self, run_id: str, step: int) -> StepManifest | None:
        data = self._get(self._manifest_path(run_id, step))
        return None if data is None else StepManifest.from_json(data.decode())

    def committed_steps(self, run_id: str) -> list[int]:
        """Steps of the run that have a manifest, ascending."""
        base = self.location.path(f"runs/{_check_name('run id', run_id)}/steps")
        steps = []
        for info in self._list(f"runs/{run_id}/steps", recursive=True):
            if info.base_name == "MANIFEST.json" and info.type == pafs.FileType.File:
                step_dir = info.path[len(base) + 1 :].split("/")[0]
                if step_dir.isdigit():
                    steps.append(int(step_dir))
        return sorted(steps)

    def committed_parts(self, run_id: str | None = None) -> list[PartRef]:
        """Parts listed in committed manifests, of one run or of every run."""
        run_ids = [run_id] if run_id is not None else self.list_runs(require_info=False)
        parts: list[PartRef] = []
        for rid in run_ids:
            for step in self.committed_steps(rid):
                manifest = self.read_manifest(rid, step)
                if manifest is not None:
                    parts.extend(manifest.parts)
        return parts

    def write_staged(self, run_id: str, step: int, stage: str, trajectories: list[Trajectory]) -> str:
        """Store the rows a stage hands to the next; return their reference (content-addressed)."""
        data = _parquet_bytes(trajectories)
        digest = hashlib.sha256(data).hexdigest()[:16]
        relative = (
            f"staging/run_id={_check_name('run id', run_id)}/step={step}/"
            f"{_check_name('stage', stage)}-{digest}.parquet"
        )
        self._put(relative, data)
        return relative

    def read_staged(self, staged_uri: str) -> list[Trajectory]:
        """The rows behind a reference from write_staged; StorageUnavailable if gone."""
        if not _STAGED_PATTERN.match(staged_uri):
            raise ValueError(f"not a staged-rows reference: {staged_uri!r}")
        data = self._get(staged_uri)
        if data is None:
            raise StorageUnavailable(
                f"lake {self.uri}: staged rows {staged_uri} are missing",
                hint="rerun the step's earlier stages (they were cleaned or never written)",
            )
        return from_table(pq.read_table(pa.BufferReader(data)))

    def clean_staged(self, run_id: str, step: int) -> None:
        """Delete the staged rows of a step (call after it is committed; missing is fine)."""
        path = self.location.path(f"staging/run_id={_check_name('run id', run_id)}/step={step}")
        with _storage_errors(f"cleaning staged rows of step {step}", self.location):
            if self._fs.get_file_info(path).type == pafs.FileType.Directory:
                self._fs.delete_dir(path)

    def write_json(self, run_id: str, name: str, document: dict[str, object]) -> None:
        """Store a small JSON document (e.g. "evals/before_rl.json") under runs/{run_id}/."""
        self._put(self._document_path(run_id, name), json.dumps(document, indent=2).encode())

    def read_json(self, run_id: str, name: str) -> dict[str, object] | None:
        data = self._get(self._document_path(run_id, name))
        return None if data is None else json.loads(data.decode())

    def _document_path(self, run_id: str, name: str) -> str:
        pieces = name.split("/")
        if not name.endswith(".json") or any(not _NAME_PATTERN.match(piece) for piece in pieces):
            raise ValueError(f"bad document name {name!r}: use folder/name.json with plain names")
        if pieces[0] in ("run.json", "status.json", "steps"):
            raise ValueError(f"document name {name!r} collides with the lake's own files")
        return f"runs/{_check_name('run id', run_id)}/{name}"

    def _manifest_path(self, run_id: str, step: int) -> str:
        return f"runs/{_check_name('run id', run_id)}/steps/{step:06d}/MANIFEST.json"

    # -- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(self, run_id: str, step: int, local_dir: Path) -> CheckpointInfo:
        """Upload every file under `local_dir`, then CHECKPOINT.json, then LATEST.
        Saving a step that already has a complete checkpoint keeps the stored one."""
        base = self._checkpoint_dir(run_id, step)
        existing = self._get(f"{base}/CHECKPOINT.json")
        if existing is not None:  # a retried save: the complete checkpoint stays as it is
            self._advance_latest(run_id, step)
            return CheckpointInfo.from_json(existing.decode())
        local_files = sorted(p for p in Path(local_dir).rglob("*") if p.is_file())
        if not local_files:
            raise ValueError(f"checkpoint folder {local_dir} holds no files")
        files = []
        for local_path in local_files:
            relative = local_path.relative_to(local_dir).as_posix()
            size_bytes, digest = self._upload(local_path, f"{base}/{relative}")
            files.append(CheckpointFile(path=relative, size_bytes=size_bytes, sha256=digest))
        info = CheckpointInfo(run_id=run_id, step=step, files=tuple(files), saved_at_ms=_now_ms())
        self._put(f"{base}/CHECKPOINT.json", info.to_json().encode())
        self._advance_latest(run_id, step)
        return info

    def _advance_latest(self, run_id: str, step: int) -> None:
        """LATEST holds the highest complete step: never move it backwards."""
        data = self._get(f"checkpoints/{run_id}/LATEST")
        if data is None or int(data.decode().strip()) <= step:
            self._put(f"checkpoints/{run_id}/LATEST", str(step).encode())

    def latest_checkpoint(self, run_id: str, at_or_before: int | None = None) -> int | None:
        """The newest complete checkpoint step (at or before a step when given), or None."""
        if at_or_before is None:
            data = self._get(f"checkpoints/{_check_name('run id', run_id)}/LATEST")
            if data is not None:
                latest = int(data.decode().strip())
                if self._get(f"{self._checkpoint_dir(run_id, latest)}/CHECKPOINT.json") is not None:
                    return latest
        steps = sorted(
            (int(info.base_name.removeprefix("step=")) for info in self._list(f"checkpoints/{run_id}")
             if info.type == pafs.FileType.Directory and info.base_name.removeprefix("step=").isdigit()),
            reverse=True,
        )
        for step in steps:
            if at_or_before is not None and step > at_or_before:
                continue
            if self._get(f"{self._checkpoint_dir(run_id, step)}/CHECKPOINT.json") is not None:
                return step
        return None

    def load_checkpoint(self, run_id: str, step: int, local_dir: Path) -> CheckpointInfo | None:
        """Download a complete checkpoint into `local_dir` (digests checked), or None."""
        base = self._checkpoint_dir(run_id, step)
        data = self._get(f"{base}/CHECKPOINT.json")
        if data is None:
            return None
        info = CheckpointInfo.from_json(data.decode())
        for file in info.files:
            digest = self._download(f"{base}/{file.path}", Path(local_dir) / file.path)
            if digest != file.sha256:
                raise StorageUnavailable(
                    f"lake {self.uri}: checkpoint file {base}/{file.path} has sha256 {digest}, expected {file.sha256}",
                    hint="the checkpoint was altered; load an older one (latest_checkpoint(at_or_before=...))",
                )
        return info

    def _checkpoint_dir(self, run_id: str, step: int) -> str:
        return f"checkpoints/{_check_name('run id', run_id)}/step={step:06d}"

    # -- bytes in and out ---------------------------------------------------------------------------

    def _put(self, relative: str, data: bytes) -> None:
        path = self.location.path(relative)
        with _storage_errors(f"writing {relative}", self.location):
            if self.location.is_local:
                _atomic_local_write(Path(path), data)
            else:
                with self._fs.open_output_stream(path) as stream:
                    stream.write(data)

    def _get(self, relative: str) -> bytes | None:
        try:
            with _storage_errors(f"reading {relative}", self.location):
                with self._fs.open_input_stream(self.location.path(relative)) as stream:
                    return stream.read()
        except FileNotFoundError:
            return None

    def _list(self, relative: str, recursive: bool = False) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(self.location.path(relative), allow_not_found=True, recursive=recursive)
        with _storage_errors(f"listing {relative}", self.location):
            infos = self._fs.get_file_info(selector)
        return [info for info in infos if not info.base_name.startswith(".tmp-")]

    def _upload(self, local_path: Path, relative: str) -> tuple[int, str]:
        path = self.location.path(relative)
        digest, size_bytes = hashlib.sha256(), 0
        with _storage_errors(f"uploading {relative}", self.location):
            if self.location.is_local:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(local_path, "rb") as source, self._fs.open_output_stream(path) as target:
                while chunk := source.read(_CHUNK_BYTES):
                    digest.update(chunk)
                    size_bytes += len(chunk)
                    target.write(chunk)
        return size_bytes, digest.hexdigest()

    def _download(self, relative: str, local_path: Path) -> str:
        digest = hashlib.sha256()
        local_path.parent.mkdir(parents=True, exist_ok=True)
        partial = local_path.with_name(f".tmp-{uuid.uuid4().hex}-{local_path.name}")
        with _storage_errors(f"downloading {relative}", self.location):
            try:
                with self._fs.open_input_stream(self.location.path(relative)) as source, open(partial, "wb") as target:
                    while chunk := source.read(_CHUNK_BYTES):
                        digest.update(chunk)
                        target.write(chunk)
            except FileNotFoundError as exc:
                partial.unlink(missing_ok=True)
                raise StorageUnavailable(
                    f"lake {self.uri}: checkpoint file {relative} listed in CHECKPOINT.json is missing",
                    hint="the checkpoint is incomplete; load an older one",
                ) from exc
            os.replace(partial, local_path)
        return digest.hexdigest()


def _parquet_bytes(trajectories: list[Trajectory]) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(to_table(trajectories), buffer, compression="zstd")
    return buffer.getvalue()


def _atomic_local_write(path: Path, data: bytes) -> None:
    """Write to a tmp file in the same folder, fsync, rename over the target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".tmp-{uuid.uuid4().hex}-{path.name}")
    try:
        with open(partial, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(partial, path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power cut
        finally:
            os.close(directory)
    finally:
        partial.unlink(missing_ok=True)
