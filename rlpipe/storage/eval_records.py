"""The records of agent evals in the lake (storage/evals.py stores them): typed rows and their Arrow schemas.

Pure: no filesystem, no client, so rlpipe/agents may build and read these rows without
reaching the lake's infrastructure clients (the layers contract of pyproject.toml).

    EvalInfo        evals/{eval_id}/EVAL.json
    EvalTrialRow    one trial attempt, EVAL_TRIAL_SCHEMA (the `eval_trials` view)
    EvalStepRow     one step of an attempt, EVAL_STEP_SCHEMA (the `eval_steps` view)
    TrialCommit     COMMIT.json of an attempt, written last

What it does not: read or write anything.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, fields
from typing import Any

import pyarrow as pa

from rlpipe.core.errors import ConfigError
from rlpipe.storage.lake_records import LakeDocument, PartRef

SCHEMA_VERSION = 1
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class EvalInfo(LakeDocument):
    """evals/{eval_id}/EVAL.json: what the eval runs (a resume reruns exactly this)."""

    eval_id: str
    agent: str
    backend: str
    tasks_dir: str  # absolute folder, or "" for the built-in suite
    task_ids: tuple[str, ...]
    max_attempts: int
    command_timeout_s: float
    created_at_ms: int
    agent_options: dict[str, Any] = field(default_factory=dict)  # the policy agent's (agents/policy.PolicyOptions)
    replay_of: str | None = None  # a replay eval: the source trial id (`rlpipe eval replay`)
    replay_from_step: int | None = None  # ... and how many of its steps were re-executed


@dataclass(frozen=True)
class EvalTrialRow:
    """One trial attempt (one row of eval_trials)."""

    eval_id: str
    trial_id: str  # {eval_id}/{task_key}/{attempt}
    task_id: str
    attempt: int  # 1, 2, ... per task: an infrastructure failure is retried as the next attempt
    session: int  # 0 for the first `rlpipe eval`, 1 for the first --resume, ...
    agent: str
    backend: str
    verdict: str
    family: str  # agent, infrastructure, not_run
    ending: str
    reward: float | None
    detail: str
    instruction: str  # the agent's first observation (after the system prompt)
    steps: int
    tool_calls: int
    malformed_calls: int
    agent_duration_s: float
    verifier_duration_s: float
    duration_s: float
    started_at_ms: int
    finished_at_ms: int
    schema_version: int = SCHEMA_VERSION
    replay_of: str | None = None  # a replayed trial: the source trial id ...
    replay_from_step: int | None = None  # ... and the steps of it re-executed before this agent took over


@dataclass(frozen=True)
class EvalStepRow:
    """One step of a trial attempt (one row of eval_steps)."""

    eval_id: str
    trial_id: str
    task_id: str
    attempt: int
    step: int  # 0-based
    reply: str  # the agent's raw reply (the action)
    tool: str | None  # None: malformed
    arguments_json: str  # the parsed call's arguments as a JSON object ("{}" when malformed)
    malformed_kind: str | None
    observation: str  # the tool's result as the agent saw it
    exit_code: int | None  # bash only
    tool_error: bool
    started_s: float  # seconds after the episode started
    duration_s: float
    schema_version: int = SCHEMA_VERSION
    tree_sha256: str | None = None  # digest of /work after the step (agents/tree_state.py); None: not taken


@dataclass(frozen=True)
class TrialCommit(LakeDocument):
    """COMMIT.json of one attempt: its parts, and the verdict (listing needs no Parquet read)."""

    eval_id: str
    task_id: str
    attempt: int
    verdict: str
    family: str
    trial_part: PartRef
    steps_part: PartRef
    committed_at_ms: int


def _arrow_type(annotation: str) -> pa.DataType:
    base = annotation.replace(" | None", "")
    return {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}[base]


def _schema(record: type) -> pa.Schema:
    return pa.schema([pa.field(f.name, _arrow_type(str(f.type)), nullable="None" in str(f.type)) for f in fields(record)])


EVAL_TRIAL_SCHEMA = _schema(EvalTrialRow)
EVAL_STEP_SCHEMA = _schema(EvalStepRow)


def task_key(task_id: str) -> str:
    """The lake path piece of a task id (the id when plain, else a digest)."""
    return task_id if _PLAIN.match(task_id) else "task-" + hashlib.sha256(task_id.encode()).hexdigest()[:16]


def check_eval_id(eval_id: str) -> str:
    if not _PLAIN.match(eval_id):
        raise ConfigError(f"eval id {eval_id!r} cannot be used in lake paths",
                          hint="use letters, digits, '.', '_' and '-' (at most 128, not starting with '.')")
    return eval_id


def rows_table(rows: list, record: type, schema: pa.Schema) -> pa.Table:
    """Rows of a record type as an Arrow table of its schema."""
    columns = {f.name: [getattr(row, f.name) for row in rows] for f in fields(record)}
    return pa.table(columns, schema=schema)
