"""The lake: run documents, Parquet trajectory parts, step manifests and checkpoints.

Layout under the root (a folder or s3://bucket/prefix):

    runs/{run_id}/run.json                         RunInfo
    runs/{run_id}/status.json                      RunStatus (overwritten as the run moves; fsynced once it ends)
    runs/{run_id}/steps/{step:06d}/MANIFEST.json   StepManifest, written LAST for the step
    runs/{run_id}/steps/{step:06d}/TRAIN.json      StepTrainMetrics, after the manifest (update, timings)
    trajectories/run_id={run_id}/step={step}/part-{name}.parquet   immutable, zstd; run_id and
                                                   step only in the path (schema.PART_SCHEMA):
                                                   the rows the run trains on, nothing else
    set_apart/run_id={run_id}/step={step}/part-set-apart.parquet   the rows dynamic sampling set
                                                   apart (same schema), outside trajectories/ so
                                                   that other readers of that folder see what
                                                   rlpipe trains on
    checkpoints/{run_id}/step={step:06d}/...       an HF model folder with the trainer's state
                                                   beside it (rl/checkpoint_layout.py)
    checkpoints/{run_id}/step={step:06d}/CHECKPOINT.json   file list + digests, after the files
    checkpoints/{run_id}/LATEST                    the highest complete step, written last
    staging/run_id={run_id}/step={step}/{stage}-{digest}.arrow     rows passed between stages (Arrow IPC, lz4)
    staging/run_id={run_id}/step={step}/{stage}-{digest}.json      their PartRef (rows, sha256), after them
    runs/{run_id}/{document}.json                  small JSON documents (evaluations, ...)
    runs/{run_id}/rescores/{rescore_id}/...        re-scored verdicts beside the run (storage/rescores.py)
    verdicts/verifier={version}/part-{digest}.parquet   the verdict cache (storage/verdict_cache.py)

What it guarantees: a step is committed iff its manifest exists, and readers reach parts
only through manifests, so a part orphaned by a crash is never read. Every document is
written atomically (storage/objects.py: tmp file + fsync + rename on disk; one PUT on S3).
Writing the same part twice is harmless: the caller picks a deterministic name, and the
bytes are the same. Re-committing a step keeps the first manifest (and so its metric
timestamps). A checkpoint counts only once its CHECKPOINT.json exists; LATEST never moves
back. Staged rows (what the stages of an uncommitted step computed, kept so that a retry or a
resume does not compute them again) are named by a digest of their key (run incarnation,
step, round, stage, config hash, policy version), so a name never changes meaning; they sit
outside trajectories/ and are never queried. Staged rows count once their PartRef (written
after them) exists, and are read back only when their sha256 matches it. Storage failures
raise StorageUnavailable (an InfraError: retried); a committed part or checkpoint file that
is missing or fails its sha256 raises LakeCorrupted (not retried: the same bytes would be
read again); staged rows that are missing, lack their PartRef or fail its sha256 read as
None (logged: the caller computes them again), and a missing document reads as None.

A set-apart part of a lake written before set_apart/ existed is listed in its manifest under
trajectories/; it is read there, or under set_apart/ once moved (`set_apart_path`), its
digest checked either way.

What it does not: lock against two writers committing the same step at once (one run has
one controller), garbage-collect orphans, or know about MLflow or Prefect. Checkpoint folders
are written, read and deleted by storage/checkpoint_store.py (`Lake.checkpoints`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rlpipe.core.errors import ConfigError, LakeCorrupted
from rlpipe.core.records import Trajectory
from rlpipe.storage.checkpoint_store import CheckpointStore
from rlpipe.storage.filesystem import LakeLocation, open_lake_location
from rlpipe.storage.lake_records import (
    CheckpointInfo,
    PartRef,
    RunInfo,
    RunState,
    RunStatus,
    StepManifest,
    StepTrainMetrics,
)
from rlpipe.storage.objects import ObjectStore, storage_errors
from rlpipe.storage.schema import (
    TRAJECTORY_SCHEMA,
    from_table,
    partition_of,
    to_part_table,
    to_table,
    with_partition_columns,
)
from rlpipe.storage.table_bytes import ipc_bytes, ipc_table, parquet_bytes

TRAJECTORIES = "trajectories"
"""The folder of the rows runs train on: what a reader of the lake points at."""
SET_APART = "set_apart"
"""The folder of the rows dynamic sampling generated and set apart (not trained on)."""

_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _check_name(kind: str, value: str) -> str:
    if not _NAME_PATTERN.match(value):
        raise ConfigError(
            f"{kind} {value!r} cannot be used in lake paths",
            hint="use letters, digits, '.', '_' and '-' (at most 128, not starting with '.')",
        )
    return value


class Lake:
    """Reads and writes one lake. Build with `Lake.open(uri, ...)` or `Lake(location)`."""

    def __init__(self, location: LakeLocation) -> None:
        self.location = location
        self.objects = ObjectStore(location)
        self.checkpoints = CheckpointStore(location, self.objects, _check_name)
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
        self.objects.put(f"runs/{_check_name('run id', info.run_id)}/run.json", info.to_json().encode())

    def read_run_info(self, run_id: str) -> RunInfo | None:
        data = self.objects.get(f"runs/{_check_name('run id', run_id)}/run.json")
        return None if data is None else RunInfo.from_json(data.decode())

    def list_runs(self, require_info: bool = True) -> list[str]:
        """Run ids that have a run.json (any folder under runs/ when not `require_info`), sorted."""
        listed = self.objects.list("runs")
        candidates = [info.base_name for info in listed if info.type == pafs.FileType.Directory]
        if not require_info:
            return sorted(candidates)
        paths = [self.location.path(f"runs/{run_id}/run.json") for run_id in candidates]
        with storage_errors("listing runs", self.location):
            infos = self._fs.get_file_info(paths) if paths else []
        return sorted(run_id for run_id, info in zip(candidates, infos) if info.type == pafs.FileType.File)

    def write_status(self, status: RunStatus) -> None:
        """Replace status.json. Not fsynced while the run runs (a new one every step; a power cut
        may leave an older or damaged one, which `read_status` reads as none), fsynced once it ended."""
        relative = f"runs/{_check_name('run id', status.run_id)}/status.json"
        self.objects.put(relative, status.to_json().encode(), durable=status.state != RunState.RUNNING)

    def read_status(self, run_id: str) -> RunStatus | None:
        """The run's status; None when it has none or it does not parse (logged)."""
        data = self.objects.get(f"runs/{_check_name('run id', run_id)}/status.json")
        try:
            return None if data is None else RunStatus.from_json(data.decode())
        except ValueError as exc:  # pydantic's ValidationError and UnicodeDecodeError are ValueErrors
            logging.getLogger(__name__).warning("lake %s: status.json of run %s does not parse: %s", self.uri, run_id, exc)
            return None

    # -- trajectories and manifests ----------------------------------------------------------

    def write_part(self, run_id: str, step: int, name: str, trajectories: list[Trajectory],
                   folder: str = TRAJECTORIES) -> PartRef:
        """Write one immutable Parquet part under `folder` (TRAJECTORIES: rows the run trains
        on; SET_APART: rows it does not); the same (run_id, step, name, rows) -> same bytes."""
        if folder not in (TRAJECTORIES, SET_APART):
            raise ValueError(f"parts go under {TRAJECTORIES}/ or {SET_APART}/, not {folder!r}")
        relative = (
            f"{folder}/run_id={_check_name('run id', run_id)}/step={step}/"
            f"part-{_check_name('part name', name)}.parquet"
        )
        data = parquet_bytes(to_part_table(trajectories, run_id, step))
        self.objects.put(relative, data, crash_point="part-write")
        return PartRef(path=relative, rows=len(trajectories), sha256=hashlib.sha256(data).hexdigest())

    def write_set_apart(self, run_id: str, step: int, trajectories: list[Trajectory]) -> PartRef:
        """The part of the rows a step generated and does not train on, under set_apart/."""
        return self.write_part(run_id, step, "set-apart", trajectories, folder=SET_APART)

    def read_parts(self, parts: tuple[PartRef, ...] | list[PartRef]) -> list[Trajectory]:
        """The rows of the parts, in order; LakeCorrupted if one is missing or altered."""
        return from_table(self.read_parts_table(parts))

    def read_parts_table(self, parts: tuple[PartRef, ...] | list[PartRef],
                         columns: tuple[str, ...] | None = None) -> pa.Table:
        """Like read_parts, as one Arrow table with TRAJECTORY_SCHEMA, or only its
        `columns` (the others are not decoded)."""
        names = tuple(TRAJECTORY_SCHEMA.names) if columns is None else columns
        tables = [pa.schema([TRAJECTORY_SCHEMA.field(name) for name in names]).empty_table()]
        for part in parts:
            parquet = pq.ParquetFile(pa.BufferReader(self._checked_part_bytes(part)))
            in_part = set(parquet.schema_arrow.names)  # the property converts the file's schema on each use
            stored = [name for name in names if name in in_part]
            tables.append(with_partition_columns(parquet.read(columns=stored), *partition_of(part.path), names=names))
        return pa.concat_tables(tables)

    def iter_parts(self, parts: tuple[PartRef, ...] | list[PartRef], batch_rows: int) -> Iterator[list[Trajectory]]:
        """The rows of the parts in order, at most `batch_rows` at a time: one part's bytes
        (digest checked first, LakeCorrupted as read_parts) and one batch of rows in memory."""
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
        for part in parts:
            run_id, step = partition_of(part.path)
            parquet = pq.ParquetFile(pa.BufferReader(self._checked_part_bytes(part)))
            for batch in parquet.iter_batches(batch_size=batch_rows):
                yield from_table(with_partition_columns(pa.Table.from_batches([batch]), run_id, step))

    def _checked_part_bytes(self, part: PartRef) -> bytes:
        """A committed part's bytes (at its manifest path, or where `set_apart_path` moved
        it); LakeCorrupted if it is missing or its sha256 is not the manifest's."""
        data = self.objects.get(part.path)
        moved = set_apart_path(part.path)
        if data is None and moved != part.path:
            data = self.objects.get(moved)
        if data is None:
            raise LakeCorrupted(
                f"lake {self.uri}: part {part.path} listed in a manifest is missing",
                hint="the lake lost a committed file; restore it or delete the step's manifest",
            )
        digest = hashlib.sha256(data).hexdigest()
        if digest != part.sha256:
            raise LakeCorrupted(
                f"lake {self.uri}: part {part.path} has sha256 {digest}, the manifest says {part.sha256}",
                hint="the file was altered after commit; restore it or delete the step's manifest",
            )
        return data

    def commit_step(self, manifest: StepManifest) -> StepManifest:
        """Commit a step by writing its manifest last. If the step is already committed,
        keep the stored manifest and return it (a retry sees the first commit's timestamp)."""
        existing = self.read_manifest(manifest.run_id, manifest.step)
        if existing is not None:
            return existing
        if manifest.rows != sum(part.rows for part in manifest.parts):
            raise ValueError(f"manifest rows {manifest.rows} != sum of part rows of step {manifest.step}")
        paths = [self.location.path(part.path) for part in manifest.parts]
        with storage_errors(f"checking the parts of step {manifest.step}", self.location):
            infos = self._fs.get_file_info(paths) if paths else []
        missing = [part.path for part, info in zip(manifest.parts, infos) if info.type != pafs.FileType.File]
        if missing:
            raise ValueError(f"cannot commit step {manifest.step}: parts not written: {missing}")
        self.objects.put(self._manifest_path(manifest.run_id, manifest.step), manifest.to_json().encode())
        return manifest

    def read_manifest(self, run_id: str, step: int) -> StepManifest | None:
        data = self.objects.get(self._manifest_path(run_id, step))
        return None if data is None else StepManifest.from_json(data.decode())

    def record_train_metrics(self, run_id: str, step: int, metrics: dict[str, float]) -> StepTrainMetrics:
        """Store the after-commit metrics of a committed step (merged over those stored: a
        replayed update brings its train/* metrics again, not the first run's timings)."""
        if self.read_manifest(run_id, step) is None:
            raise ValueError(f"step {step} of run {run_id} is not committed: its train metrics have no step to join")
        stored = self.read_train_metrics(run_id, step)
        merged = {**(dict(stored.metrics) if stored else {}), **{name: float(value) for name, value in metrics.items()}}
        record = StepTrainMetrics(run_id=run_id, step=step, metrics=tuple(sorted(merged.items())))
        self.objects.put(self._step_path(run_id, step, "TRAIN.json"), record.to_json().encode())
        return record

    def read_train_metrics(self, run_id: str, step: int) -> StepTrainMetrics | None:
        data = self.objects.get(self._step_path(run_id, step, "TRAIN.json"))
        return None if data is None else StepTrainMetrics.from_json(data.decode())

    def committed_steps(self, run_id: str) -> list[int]:
        """Steps of the run that have a manifest, ascending."""
        base = self.location.path(f"runs/{_check_name('run id', run_id)}/steps")
        steps = []
        for info in self.objects.list(f"runs/{run_id}/steps", recursive=True):
            if info.base_name == "MANIFEST.json" and info.type == pafs.FileType.File:
                step_dir = info.path[len(base) + 1 :].split("/")[0]
                if step_dir.isdigit():
                    steps.append(int(step_dir))
        return sorted(steps)

    def committed_manifests(self, run_id: str | None = None) -> list[StepManifest]:
        """The manifests of committed steps, of one run or of every run."""
        run_ids = [run_id] if run_id is not None else self.list_runs(require_info=False)
        manifests: list[StepManifest] = []
        for rid in run_ids:
            for step in self.committed_steps(rid):
                manifest = self.read_manifest(rid, step)
                if manifest is not None:
                    manifests.append(manifest)
        return manifests

    def committed_parts(self, run_id: str | None = None) -> list[PartRef]:
        """Parts listed in committed manifests (trained and set apart), of one run or of every run."""
        return [part for manifest in self.committed_manifests(run_id) for part in manifest.parts + manifest.set_apart]

    def write_staged(self, run_id: str, step: int, stage: str, key: str, trajectories: list[Trajectory]) -> str:
        """Store the rows a stage of an uncommitted step computed under `key` (everything that
        determines them: orchestration/stage_options.py `stage_key`); return their path. The name is
        a digest of the key, so a retry or a resumed run finds them with `read_staged`. Arrow IPC
        (storage/table_bytes.py), not Parquet: read back by rlpipe only, then deleted. Not
        fsynced (two files and two fsyncs each, every step): `read_staged` checks the rows
        against the digest and a stage whose rows a power cut lost or damaged is computed again."""
        relative = self._staged_path(run_id, step, stage, key)
        data = ipc_bytes(to_table(trajectories))
        self.objects.put(relative, data, durable=False)
        ref = PartRef(path=relative, rows=len(trajectories), sha256=hashlib.sha256(data).hexdigest())
        self.objects.put(_staged_ref_path(relative), ref.to_json().encode(), durable=False)  # last: the rows count from here
        return relative

    def read_staged(self, run_id: str, step: int, stage: str, key: str) -> list[Trajectory] | None:
        """The rows `write_staged` stored for (stage, key), their sha256 checked against the
        PartRef written after them; None when there are none (never staged, cleaned after
        the commit, lost, cut short before the PartRef) or they fail the check, or the
        PartRef itself does not parse (logged): either way the caller computes them again."""
        relative = self._staged_path(run_id, step, stage, key)
        ref_data = self.objects.get(_staged_ref_path(relative))
        data = self.objects.get(relative) if ref_data is not None else None
        if ref_data is None or data is None:
            return None
        try:
            expected = PartRef.from_json(ref_data.decode()).sha256
        except (ValueError, KeyError, TypeError):  # not fsynced (write_staged): a power cut may leave it damaged
            expected = "a PartRef that does not parse"
        digest = hashlib.sha256(data).hexdigest()
        if digest != expected:
            logging.getLogger(__name__).warning(
                "lake %s: staged rows %s have sha256 %s, their PartRef says %s (altered or damaged): "
                "not used, the stage computes them again", self.uri, relative, digest, expected)
            return None
        return from_table(ipc_table(data))

    def _staged_path(self, run_id: str, step: int, stage: str, key: str) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        return f"staging/run_id={_check_name('run id', run_id)}/step={step}/{_check_name('stage', stage)}-{digest}.arrow"

    def clean_staged(self, run_id: str, step: int) -> None:
        """Delete the staged rows of a step (call after it is committed; missing is fine)."""
        path = self.location.path(f"staging/run_id={_check_name('run id', run_id)}/step={step}")
        with storage_errors(f"cleaning staged rows of step {step}", self.location):
            if self._fs.get_file_info(path).type == pafs.FileType.Directory:
                self._fs.delete_dir(path)

    def write_json(self, run_id: str, name: str, document: dict[str, object]) -> None:
        """Store a small JSON document (e.g. "evals/before_rl.json") under runs/{run_id}/."""
        self.objects.put(self._document_path(run_id, name), json.dumps(document, indent=2).encode())

    def read_json(self, run_id: str, name: str) -> dict[str, object] | None:
        data = self.objects.get(self._document_path(run_id, name))
        return None if data is None else json.loads(data.decode())

    def _document_path(self, run_id: str, name: str) -> str:
        pieces = name.split("/")
        if not name.endswith(".json") or any(not _NAME_PATTERN.match(piece) for piece in pieces):
            raise ValueError(f"bad document name {name!r}: use folder/name.json with plain names")
        if pieces[0] in ("run.json", "status.json", "steps"):
            raise ValueError(f"document name {name!r} collides with the lake's own files")
        return f"runs/{_check_name('run id', run_id)}/{name}"

    def _manifest_path(self, run_id: str, step: int) -> str:
        return self._step_path(run_id, step, "MANIFEST.json")

    def _step_path(self, run_id: str, step: int, name: str) -> str:
        return f"runs/{_check_name('run id', run_id)}/steps/{step:06d}/{name}"

    # -- checkpoints (storage/checkpoint_store.py) ---------------------------------------------

    def save_checkpoint(self, run_id: str, step: int, local_dir: Path) -> CheckpointInfo:
        """Copy every file under `local_dir`, then CHECKPOINT.json, then LATEST. Saving a step
        that already has a complete checkpoint keeps the stored one."""
        return self.checkpoints.save_folder(run_id, step, local_dir)

    def latest_checkpoint(self, run_id: str, at_or_before: int | None = None) -> int | None:
        """The newest complete checkpoint step (at or before a step when given), or None."""
        return self.checkpoints.latest(run_id, at_or_before)

    def checkpoint_steps(self, run_id: str) -> list[int]:
        """The steps of `run_id` that have a complete checkpoint (CHECKPOINT.json), ascending."""
        return self.checkpoints.steps(run_id)

    def load_checkpoint(self, run_id: str, step: int, local_dir: Path, only: Callable[[str], bool] | None = None) -> CheckpointInfo | None:
        """Download a complete checkpoint into `local_dir` (digests checked), or None; with `only`,
        the files whose relative path it accepts. LakeCorrupted: a listed file missing or altered."""
        return self.checkpoints.load(run_id, step, local_dir, only)


def set_apart_path(path: str) -> str:
    """Where a set-apart part that a manifest lists under trajectories/ (the layout before
    set_apart/) lies once moved out of that folder; any other path unchanged."""
    prefix, _, rest = path.partition("/")
    if prefix == TRAJECTORIES and rest.endswith("/part-set-apart.parquet"):
        return f"{SET_APART}/{rest}"
    return path


def _staged_ref_path(relative: str) -> str:
    return relative.removesuffix(".arrow") + ".json"
