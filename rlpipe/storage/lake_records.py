"""The small JSON documents of the lake: run info, run status, step manifests, checkpoints.

What it does: frozen dataclasses for each document and their exact JSON round trip
(`to_json()` / `from_json(text)`), so the lake never hands out dicts. Times are unix
milliseconds (`*_ms`).

What it does not: touch storage (storage/lake.py does) or hold trajectories (they are
Parquet, storage/schema.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum


class RunState(str, Enum):
    """Where a run stands, as written to status.json."""

    RUNNING = "running"
    FAILED = "failed"
    FINISHED = "finished"


@dataclass(frozen=True)
class RunInfo:
    """runs/{run_id}/run.json: what the run is. Written once at start (and on tracking ids)."""

    run_id: str
    config_json: str
    config_hash: str
    code_version: str
    created_at_ms: int
    mlflow_run_id: str | None = None
    prefect_flow_run_id: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "run_id": self.run_id,
                "config_json": self.config_json,
                "config_hash": self.config_hash,
                "code_version": self.code_version,
                "created_at_ms": self.created_at_ms,
                "mlflow_run_id": self.mlflow_run_id,
                "prefect_flow_run_id": self.prefect_flow_run_id,
            },
            indent=2,
        )

    @staticmethod
    def from_json(text: str) -> RunInfo:
        d = json.loads(text)
        return RunInfo(
            run_id=d["run_id"],
            config_json=d["config_json"],
            config_hash=d["config_hash"],
            code_version=d["code_version"],
            created_at_ms=int(d["created_at_ms"]),
            mlflow_run_id=d.get("mlflow_run_id"),
            prefect_flow_run_id=d.get("prefect_flow_run_id"),
        )


@dataclass(frozen=True)
class RunStatus:
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

    def to_json(self) -> str:
        return json.dumps(
            {
                "run_id": self.run_id,
                "state": self.state.value,
                "step": self.step,
                "stage": self.stage,
                "error": self.error,
                "updated_at_ms": self.updated_at_ms,
            },
            indent=2,
        )

    @staticmethod
    def from_json(text: str) -> RunStatus:
        d = json.loads(text)
        return RunStatus(
            run_id=d["run_id"],
            state=RunState(d["state"]),
            step=int(d["step"]),
            stage=d["stage"],
            error=d.get("error"),
            updated_at_ms=int(d["updated_at_ms"]),
        )


@dataclass(frozen=True)
class PartRef:
    """One Parquet part: `path` relative to the lake root, its row count and sha256 digest."""

    path: str
    rows: int
    sha256: str


@dataclass(frozen=True)
class StepManifest:
    """runs/{run_id}/steps/{step:06d}/MANIFEST.json: a step is committed iff this exists.

    `metrics` are (name, value) pairs in a stable order; `committed_at_ms` is the time
    stamped on the step's MLflow metric points (so a retried step logs the same points).
    """

    run_id: str
    step: int
    policy_version: int
    parts: tuple[PartRef, ...]
    rows: int
    metrics: tuple[tuple[str, float], ...]
    committed_at_ms: int

    def metric(self, name: str) -> float | None:
        return next((value for key, value in self.metrics if key == name), None)

    def to_json(self) -> str:
        return json.dumps(
            {
                "run_id": self.run_id,
                "step": self.step,
                "policy_version": self.policy_version,
                "parts": [
                    {"path": p.path, "rows": p.rows, "sha256": p.sha256} for p in self.parts
                ],
                "rows": self.rows,
                "metrics": [[name, value] for name, value in self.metrics],
                "committed_at_ms": self.committed_at_ms,
            },
            indent=2,
        )

    @staticmethod
    def from_json(text: str) -> StepManifest:
        d = json.loads(text)
        return StepManifest(
            run_id=d["run_id"],
            step=int(d["step"]),
            policy_version=int(d["policy_version"]),
            parts=tuple(
                PartRef(path=p["path"], rows=int(p["rows"]), sha256=p["sha256"])
                for p in d["parts"]
            ),
            rows=int(d["rows"]),
            metrics=tuple((str(name), float(value)) for name, value in d["metrics"]),
            committed_at_ms=int(d["committed_at_ms"]),
        )


@dataclass(frozen=True)
class CheckpointFile:
    """One file of a checkpoint: `path` relative to the checkpoint folder."""

    path: str
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class CheckpointInfo:
    """checkpoints/{run_id}/step={step:06d}/CHECKPOINT.json, written after its files."""

    run_id: str
    step: int
    files: tuple[CheckpointFile, ...]
    saved_at_ms: int

    def to_json(self) -> str:
        return json.dumps(
            {
                "run_id": self.run_id,
                "step": self.step,
                "files": [
                    {"path": f.path, "size_bytes": f.size_bytes, "sha256": f.sha256}
                    for f in self.files
                ],
                "saved_at_ms": self.saved_at_ms,
            },
            indent=2,
        )

    @staticmethod
    def from_json(text: str) -> CheckpointInfo:
        d = json.loads(text)
        return CheckpointInfo(
            run_id=d["run_id"],
            step=int(d["step"]),
            files=tuple(
                CheckpointFile(path=f["path"], size_bytes=int(f["size_bytes"]), sha256=f["sha256"])
                for f in d["files"]
            ),
            saved_at_ms=int(d["saved_at_ms"]),
        )
