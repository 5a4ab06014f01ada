"""The small JSON documents of the lake: run info, run status, step manifests, checkpoints.

What it does: frozen dataclasses for each document (StepTrainMetrics too) and their exact JSON round trip
(`to_json()` / `from_json(text)`), so the lake never hands out dicts. One typed serializer
does it for every document (`LakeDocument`: a pydantic TypeAdapter per dataclass): the
fields in declaration order, tuples as JSON arrays, enums as their values, indented by 2,
non-ASCII escaped and NaN written as `NaN` (what `json.dumps` writes); reading validates
types (a wrong type raises pydantic's ValidationError, a ValueError) and ignores unknown
keys, and an optional field that is missing takes its default. Times are unix
milliseconds (`*_ms`).

What it does not: touch storage (storage/lake.py does) or hold trajectories (they are
Parquet, storage/schema.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from functools import cache
from typing import Self

from pydantic import TypeAdapter


@cache
def _adapter(record_type: type) -> TypeAdapter:
    return TypeAdapter(record_type)


class LakeDocument:
    """What every lake document dataclass inherits: its JSON text and back, typed."""

    def to_json(self) -> str:
        # python mode keeps floats as they are (NaN included) and json.dumps writes the text
        # the lake has always held; tuples become arrays, str enums their values
        return json.dumps(_adapter(type(self)).dump_python(self), indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        return _adapter(cls).validate_json(text)


class RunState(str, Enum):
    """Where a run stands, as written to status.json."""

    RUNNING = "running"
    FAILED = "failed"
    FINISHED = "finished"


@dataclass(frozen=True)
class RunInfo(LakeDocument):
    """runs/{run_id}/run.json: what the run is. Written once at start (and on tracking ids)."""

    run_id: str
    config_json: str
    config_hash: str
    code_version: str
    created_at_ms: int
    mlflow_run_id: str | None = None
    prefect_flow_run_id: str | None = None


@dataclass(frozen=True)
class RunStatus(LakeDocument):
    """runs/{run_id}/status.json: the last known state (overwritten as the run moves on).

    `step` is the step being worked on (or last finished), `stage` its stage
    ("generate", "verify", ...), `error` the failure message when state is FAILED.
    """

    run_id: str
    state: RunState
    step: int
    stage: str
    error: str | None
    updated_at_ms: int


@dataclass(frozen=True)
class PartRef(LakeDocument):
    """One Parquet part: `path` relative to the lake root, its row count and sha256 digest."""

    path: str
    rows: int
    sha256: str


@dataclass(frozen=True)
class StepManifest(LakeDocument):
    """runs/{run_id}/steps/{step:06d}/MANIFEST.json: a step is committed iff this exists.

    `parts` hold the rows the step trains on; `set_apart` the rows it generated and does
    not train on (dynamic sampling: groups without signal, surplus groups), kept for
    analysis. `policy_version` is the version that generated the step's rows (the async
    pipeline's v(s), rl/staleness.py). `metrics` are (name, value) pairs in a stable order;
    `committed_at_ms` is the time stamped on the step's MLflow metric points (so a retried
    step logs the same points).
    """

    run_id: str
    step: int
    policy_version: int
    parts: tuple[PartRef, ...]
    rows: int
    metrics: tuple[tuple[str, float], ...]
    committed_at_ms: int
    set_apart: tuple[PartRef, ...] = ()

    def metric(self, name: str) -> float | None:
        return next((value for key, value in self.metrics if key == name), None)


@dataclass(frozen=True)
class StepTrainMetrics(LakeDocument):
    """runs/{run_id}/steps/{step:06d}/TRAIN.json: what is known of a step only after its
    commit (the policy update's `train/*` metrics, the stage timings `time/*`), written
    after the manifest, never instead of it: a step without one is still committed.

    `metrics` are (name, value) pairs sorted by name.
    """

    run_id: str
    step: int
    metrics: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class CheckpointFile(LakeDocument):
    """One file of a checkpoint: `path` relative to the checkpoint folder, and the digest of
    its bytes in the field named after its algorithm (storage/digests.py): `xxh3_128` in the
    checkpoints rlpipe writes, `sha256` in those written before; exactly one is set."""

    path: str
    size_bytes: int
    sha256: str | None = None
    xxh3_128: str | None = None

    def __post_init__(self) -> None:
        if (self.sha256 is None) == (self.xxh3_128 is None):
            raise ValueError(f"checkpoint file {self.path} needs exactly one digest (sha256 or xxh3_128)")

    @property
    def digest(self) -> tuple[str, str]:
        """(algorithm, hex digest)."""
        return ("sha256", self.sha256) if self.sha256 is not None else ("xxh3_128", self.xxh3_128 or "")

    @classmethod
    def of(cls, path: str, size_bytes: int, algorithm: str, hexdigest: str) -> CheckpointFile:
        """The record of a file digested with `algorithm` (a field of this class)."""
        if algorithm not in ("sha256", "xxh3_128"):
            raise ValueError(f"a checkpoint file cannot record a {algorithm!r} digest")
        return cls(path=path, size_bytes=size_bytes, **{algorithm: hexdigest})


@dataclass(frozen=True)
class CheckpointInfo(LakeDocument):
    """checkpoints/{run_id}/step={step:06d}/CHECKPOINT.json, written after its files."""

    run_id: str
    step: int
    files: tuple[CheckpointFile, ...]
    saved_at_ms: int
    # what writing its files took: wall seconds, and CPU seconds of the thread that wrote them
    # (serializing, digesting, copying into the file; not the kernel's writeback); None in
    # checkpoints written before they were recorded
    write_s: float | None = None
    write_cpu_s: float | None = None
