"""Agent evals in the lake: one eval document, and every trial attempt committed on its own.

Layout under the lake root (beside runs/ and trajectories/, which belong to training runs):

    evals/{eval_id}/EVAL.json                                   EvalInfo, written when the eval starts
    evals/{eval_id}/trials/{task_key}/attempt={n}/trial.parquet  one row, EVAL_TRIAL_SCHEMA
    evals/{eval_id}/trials/{task_key}/attempt={n}/steps.parquet  one row per step, EVAL_STEP_SCHEMA
    evals/{eval_id}/trials/{task_key}/attempt={n}/COMMIT.json    TrialCommit, written LAST

A trial attempt is committed iff its COMMIT.json exists; readers reach the two parts only
through it (digests checked by `read_trial`), so the parts of an attempt a crash cut short
are never read, and the next attempt with that number simply overwrites them. Attempts are
numbered from 1 per task; a retried infrastructure failure is a new attempt, the old one
stays (so the record keeps every sandbox that died). `task_key` is the task id when it is a
plain name, else `task-` + a digest of it (the id itself is in the rows).

The records (rows, schemas, documents) are in storage/eval_records.py.

What it does not: decide what to run or retry (rlpipe/agents/evaluation.py), or know
agents' records (rlpipe/agents/recording.py converts them to these rows).
"""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rlpipe.core.errors import LakeCorrupted
from rlpipe.storage.eval_records import (
    EVAL_STEP_SCHEMA,
    EVAL_TRIAL_SCHEMA,
    EvalInfo,
    EvalStepRow,
    EvalTrialRow,
    TrialCommit,
    check_eval_id,
    rows_table,
    task_key,
)
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import PartRef
from rlpipe.storage.table_bytes import parquet_bytes


class EvalStore:
    """Reads and writes the evals/ area of one lake."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.objects = lake.objects

    @property
    def uri(self) -> str:
        return self.lake.uri

    def write_info(self, info: EvalInfo) -> None:
        self.objects.put(f"evals/{check_eval_id(info.eval_id)}/EVAL.json", info.to_json().encode())

    def read_info(self, eval_id: str) -> EvalInfo | None:
        data = self.objects.get(f"evals/{check_eval_id(eval_id)}/EVAL.json")
        return None if data is None else EvalInfo.from_json(data)

    def list_evals(self) -> list[str]:
        return sorted(info.base_name for info in self.objects.list("evals") if info.type == pafs.FileType.Directory)

    def commit_trial(self, trial: EvalTrialRow, steps: list[EvalStepRow]) -> TrialCommit:
        """Write the attempt's two parts, then its COMMIT.json (last). An attempt already
        committed keeps its first commit (returned as it is)."""
        base = self._attempt_dir(trial.eval_id, trial.task_id, trial.attempt)
        existing = self.objects.get(f"{base}/COMMIT.json")
        if existing is not None:
            return TrialCommit.from_json(existing)
        parts = []
        for name, table in (("trial", rows_table([trial], EvalTrialRow, EVAL_TRIAL_SCHEMA)),
                            ("steps", rows_table(steps, EvalStepRow, EVAL_STEP_SCHEMA))):
            data = parquet_bytes(table)
            self.objects.put(f"{base}/{name}.parquet", data, crash_point="eval-part-write")
            parts.append(PartRef(path=f"{base}/{name}.parquet", rows=table.num_rows, sha256=hashlib.sha256(data).hexdigest()))
        commit = TrialCommit(eval_id=trial.eval_id, task_id=trial.task_id, attempt=trial.attempt, verdict=trial.verdict,
                             family=trial.family, trial_part=parts[0], steps_part=parts[1],
                             committed_at_ms=trial.finished_at_ms)
        self.objects.put(f"{base}/COMMIT.json", commit.to_json().encode())
        return commit

    def commits(self, eval_id: str | None = None) -> list[TrialCommit]:
        """Every committed attempt (of one eval, or of all), by eval, task and attempt."""
        commits = []
        for one in [check_eval_id(eval_id)] if eval_id is not None else self.list_evals():
            base = self.lake.location.path(f"evals/{one}/trials")
            for info in self.objects.list(f"evals/{one}/trials", recursive=True):
                if info.base_name == "COMMIT.json" and info.type == pafs.FileType.File:
                    data = self.objects.get(f"evals/{one}/trials/{info.path[len(base) + 1:]}")
                    if data is not None:
                        commits.append(TrialCommit.from_json(data))
        return sorted(commits, key=lambda c: (c.eval_id, c.task_id, c.attempt))

    def read_trial(self, commit: TrialCommit) -> tuple[EvalTrialRow, list[EvalStepRow]]:
        """The rows of a committed attempt; LakeCorrupted if a part is missing or altered."""
        trial = [EvalTrialRow(**row) for row in self._read_part(commit.trial_part).to_pylist()]
        steps = [EvalStepRow(**row) for row in self._read_part(commit.steps_part).to_pylist()]
        return trial[0], sorted(steps, key=lambda s: s.step)

    def part_paths(self, commits: list[TrialCommit], which: str) -> list[str]:
        """Filesystem paths of the committed `trial` or `steps` parts (for query views)."""
        return [self.lake.location.path((c.trial_part if which == "trial" else c.steps_part).path) for c in commits]

    def _read_part(self, part: PartRef) -> pa.Table:
        data = self.objects.get(part.path)
        if data is None or hashlib.sha256(data).hexdigest() != part.sha256:
            state = "is missing" if data is None else "does not match its digest"
            raise LakeCorrupted(f"lake {self.lake.uri}: eval part {part.path} {state}",
                                hint="the lake lost or altered a committed file; delete that attempt's COMMIT.json to rerun it")
        return pq.read_table(pa.BufferReader(data))

    def _attempt_dir(self, eval_id: str, task_id: str, attempt: int) -> str:
        return f"evals/{check_eval_id(eval_id)}/trials/{task_key(task_id)}/attempt={attempt}"
