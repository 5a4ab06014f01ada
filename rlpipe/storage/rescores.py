"""Re-scored verdicts in the lake: new verdict tables beside a run's trajectories.

Layout under the lake root (the run's own files are never touched):

    runs/{run_id}/rescores/{rescore_id}/part-{step:06d}[-{batch:05d}].parquet   RESCORE_SCHEMA, one part per
                                                                  batch of a step's rows (rlpipe rescore's batch_rows)
    runs/{run_id}/rescores/{rescore_id}/RESCORE.json              RescoreManifest, written LAST

A rescore is committed iff its RESCORE.json exists, and readers reach its parts only
through it (digests checked by `read_rows`), so the parts of a rescore a crash cut short are
never read. Each row holds the old verdict (as committed with the trajectory) beside the new
one, so a flip is one query: `select * from rescores where flip is not null`. Rows are keyed
to the trajectory they re-score by (run_id, step, task_id, sample_idx) and carry the sha256
of the completion text.

What it does not: verify anything (rlpipe/controller/rescore.py does), or cache verdicts
(storage/verdict_cache.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rlpipe.core.errors import LakeCorrupted
from rlpipe.storage.eval_records import rows_table
from rlpipe.storage.lake import Lake, _check_name
from rlpipe.storage.lake_records import LakeDocument, PartRef
from rlpipe.storage.table_bytes import parquet_bytes

RESCORE_SCHEMA = pa.schema(
    [
        pa.field("rescore_id", pa.string(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("domain", pa.string(), nullable=False),
        pa.field("sample_idx", pa.int64(), nullable=False),
        pa.field("completion_sha256", pa.string(), nullable=False),
        pa.field("old_reward", pa.float64()),
        pa.field("old_passed", pa.bool_()),
        pa.field("old_reason", pa.string()),
        pa.field("old_verifier_version", pa.string()),
        pa.field("reward", pa.float64()),
        pa.field("passed", pa.bool_(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
        pa.field("verify_duration_s", pa.float64(), nullable=False),
        pa.field("verifier_version", pa.string(), nullable=False),
        pa.field("cached", pa.bool_(), nullable=False),
        pa.field("flip", pa.string()),
    ]
)
"""One row per re-scored trajectory. `old_*` is the verdict committed with the trajectory,
the rest the current verifier's; `cached` is true when the verdict was not re-run (the same
verifier version had judged the same completion of the task); `flip` is "pass->fail",
"fail->pass" or null."""

PASS_TO_FAIL, FAIL_TO_PASS = "pass->fail", "fail->pass"


def flip_of(old_passed: bool | None, passed: bool) -> str | None:
    """The flip between two verdicts (an old verdict that was never scored counts as a fail)."""
    if bool(old_passed) == passed:
        return None
    return FAIL_TO_PASS if passed else PASS_TO_FAIL


def completion_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class RescoreRow:
    """One row of RESCORE_SCHEMA (fields in the schema's order)."""

    rescore_id: str
    run_id: str
    step: int
    task_id: str
    domain: str
    sample_idx: int
    completion_sha256: str
    old_reward: float | None
    old_passed: bool | None
    old_reason: str | None
    old_verifier_version: str | None
    reward: float | None
    passed: bool
    reason: str
    detail: str
    verify_duration_s: float
    verifier_version: str
    cached: bool
    flip: str | None


@dataclass(frozen=True)
class DomainVerifier(LakeDocument):
    """Which verifier versions a domain's rows were judged by, then and now."""

    domain: str
    rows: int
    stored_versions: tuple[str, ...]
    current_version: str


@dataclass(frozen=True)
class RescoreManifest(LakeDocument):
    """runs/{run_id}/rescores/{rescore_id}/RESCORE.json: the rescore is committed iff this exists."""

    rescore_id: str
    run_id: str
    env: str | None  # the --env filter, None = every domain of the run
    verifiers: tuple[DomainVerifier, ...]
    parts: tuple[PartRef, ...]
    rows: int
    verified: int  # verdicts re-run now
    cached: int  # verdicts taken from the cache (or from the trajectory, judged by the same version)
    created_at_ms: int


class RescoreStore:
    """Reads and writes the rescores of a lake's runs."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.objects = lake.objects

    def write_part(self, run_id: str, rescore_id: str, step: int, rows: list[RescoreRow], batch: int = 0) -> PartRef:
        """Write the immutable part of rescore `rescore_id` that re-scores batch `batch` of
        step `step` of the run (part-{step:06d}.parquet, then part-{step:06d}-{batch:05d}.parquet)."""
        name = f"part-{step:06d}" if batch == 0 else f"part-{step:06d}-{batch:05d}"
        relative = f"{self._dir(run_id, rescore_id)}/{name}.parquet"
        data = parquet_bytes(rows_table(rows, RescoreRow, RESCORE_SCHEMA))
        self.objects.put(relative, data)
        return PartRef(path=relative, rows=len(rows), sha256=hashlib.sha256(data).hexdigest())

    def commit(self, manifest: RescoreManifest) -> None:
        """Commit a rescore by writing its manifest last."""
        if manifest.rows != sum(part.rows for part in manifest.parts):
            raise ValueError(f"rescore {manifest.rescore_id}: manifest rows {manifest.rows} != sum of part rows")
        self.objects.put(f"{self._dir(manifest.run_id, manifest.rescore_id)}/RESCORE.json", manifest.to_json().encode())

    def read_manifest(self, run_id: str, rescore_id: str) -> RescoreManifest | None:
        data = self.objects.get(f"{self._dir(run_id, rescore_id)}/RESCORE.json")
        return None if data is None else RescoreManifest.from_json(data)

    def manifests(self, run_id: str | None = None) -> list[RescoreManifest]:
        """The committed rescores of one run, or of every run, oldest first."""
        run_ids = [run_id] if run_id is not None else self.lake.list_runs(require_info=False)
        found = []
        for one in run_ids:
            for info in self.objects.list(f"runs/{_check_name('run id', one)}/rescores"):
                if info.type == pafs.FileType.Directory:
                    manifest = self.read_manifest(one, info.base_name)
                    if manifest is not None:
                        found.append(manifest)
        return sorted(found, key=lambda m: (m.run_id, m.created_at_ms, m.rescore_id))

    def part_paths(self, manifests: list[RescoreManifest]) -> list[str]:
        """Filesystem paths of the committed parts (for the `rescores` query view)."""
        return [self.lake.location.path(part.path) for manifest in manifests for part in manifest.parts]

    def read_rows(self, manifest: RescoreManifest) -> list[RescoreRow]:
        """The rows of a committed rescore; LakeCorrupted if a part is missing or altered."""
        rows = []
        for part in manifest.parts:
            data = self.objects.get(part.path)
            if data is None or hashlib.sha256(data).hexdigest() != part.sha256:
                state = "is missing" if data is None else "does not match its digest"
                raise LakeCorrupted(f"lake {self.lake.uri}: rescore part {part.path} {state}",
                                    hint="the lake lost or altered a committed file; delete that rescore's RESCORE.json "
                                    "and run `rlpipe rescore` again")
            rows += [RescoreRow(**row) for row in pq.read_table(pa.BufferReader(data)).to_pylist()]
        return rows

    def _dir(self, run_id: str, rescore_id: str) -> str:
        return f"runs/{_check_name('run id', run_id)}/rescores/{_check_name('rescore id', rescore_id)}"
