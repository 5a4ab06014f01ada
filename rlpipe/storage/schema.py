"""The Arrow/Parquet schema of one Trajectory row, and the conversions both ways.

What it does: defines `TRAJECTORY_SCHEMA` (flat columns, so SQL over the lake needs no
struct access) and converts `list[Trajectory] <-> pa.Table` exactly: `from_table(to_table(x))
== x` for every trajectory whose logprobs are float32 values (what a model computes; a
float64 logprob comes back rounded to float32). Task metadata is stored as a JSON object
string in `task_metadata`, so SQL can read it with json_extract.

The committed parts sit under hive paths (`trajectories/run_id=R/step=S/part-*.parquet`)
and hold `PART_SCHEMA`: every column but the partition columns `run_id` and `step`, which
the path alone carries (schema version 2; version 1 parts also held them inside, with
types that made pandas, pyarrow datasets and Polars refuse to merge the two). So any reader
opens the folder with its hive defaults, and `to_part_table` / `with_partition_columns`
take the columns out and put them back for rlpipe's own readers.

What it does not: read or write files (storage/lake.py does), or migrate old schema
versions (`schema_version` is stored per row so a future reader can).
"""

from __future__ import annotations

import json
import re

import pyarrow as pa

from rlpipe.core.records import Completion, Task, Trajectory, Verdict, VerdictReason, VerifierSpec

TRAJECTORY_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int32(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("policy_version", pa.int64(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("domain", pa.string(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("verifier_kind", pa.string(), nullable=False),
        pa.field("verifier_payload", pa.string(), nullable=False),
        pa.field("reference_answer", pa.string()),
        pa.field("task_metadata", pa.string(), nullable=False),
        pa.field("sample_idx", pa.int64(), nullable=False),
        pa.field("completion_policy_version", pa.int64(), nullable=False),
        pa.field("completion_text", pa.string(), nullable=False),
        pa.field("prompt_token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("reward", pa.float64()),
        pa.field("passed", pa.bool_()),
        pa.field("reason", pa.string()),
        pa.field("detail", pa.string()),
        pa.field("verify_duration_s", pa.float64()),
        pa.field("verifier_version", pa.string()),
        pa.field("advantage", pa.float64()),
        pa.field("loss_mask", pa.list_(pa.int8())),
    ]
)
"""One row per Trajectory. Verdict columns are null on staged rows not yet verified (and
`advantage` on rows without one); committed rows always carry a verdict.
`completion_policy_version` is the policy that sampled the
completion; `policy_version` the one the trajectory was trained at (equal when synchronous).
`loss_mask` (nullable, last) marks which `token_ids` of a multi-turn episode the policy
sampled (1) and which are tool output (0); null on single-turn rows. Parts written before
it existed lack the column: every reader here fills it with null (OPTIONAL_COLUMNS), and a
pyarrow dataset opened with TRAJECTORY_SCHEMA (`rlpipe query`) does the same."""

OPTIONAL_COLUMNS = ("loss_mask",)
"""Columns added after schema version 2's first parts: absent in older parts, read as null."""

PARTITION_COLUMNS = ("run_id", "step")
"""Carried by a committed part's path (hive style), not stored inside it."""

PART_SCHEMA = pa.schema([field for field in TRAJECTORY_SCHEMA if field.name not in PARTITION_COLUMNS])
"""The columns inside a committed Parquet part."""

_PARTITION_PATH = re.compile(r"(?:^|/)run_id=([^/]+)/step=(\d+)/[^/]+$")


def partition_of(path: str) -> tuple[str, int]:
    """(run_id, step) of a part from its hive path (`.../run_id=R/step=S/part-N.parquet`)."""
    match = _PARTITION_PATH.search(path)
    if match is None:
        raise ValueError(f"not a partitioned part path (run_id=R/step=S/NAME): {path!r}")
    return match.group(1), int(match.group(2))


def _metadata_to_json(task: Task) -> str:
    keys = [key for key, _ in task.metadata]
    if len(set(keys)) != len(keys):
        raise ValueError(f"task {task.task_id!r} has duplicate metadata keys: {keys}")
    return json.dumps(dict(task.metadata), ensure_ascii=False)


def _metadata_from_json(text: str) -> tuple[tuple[str, str], ...]:
    return tuple((str(key), str(value)) for key, value in json.loads(text).items())


def _task_columns(tasks: list[Task]) -> dict[str, list]:
    """The task columns, one entry per row; the metadata JSON once per distinct Task object
    (the rows of a group share theirs)."""
    metadata: dict[int, str] = {}
    for task in tasks:
        if id(task) not in metadata:
            metadata[id(task)] = _metadata_to_json(task)
    return {
        "task_id": [task.task_id for task in tasks],
        "domain": [task.domain for task in tasks],
        "prompt": [task.prompt for task in tasks],
        "verifier_kind": [task.verifier.kind for task in tasks],
        "verifier_payload": [task.verifier.payload for task in tasks],
        "reference_answer": [task.reference_answer for task in tasks],
        "task_metadata": [metadata[id(task)] for task in tasks],
    }


def to_table(trajectories: list[Trajectory]) -> pa.Table:
    """Trajectories -> a table with TRAJECTORY_SCHEMA (row order kept), built column by column."""
    for t in trajectories:
        if t.completion.task_id != t.task.task_id:
            raise ValueError(f"completion of task {t.completion.task_id!r} stored under task {t.task.task_id!r}")
    completions = [t.completion for t in trajectories]
    verdicts = [t.verdict for t in trajectories]
    columns: dict[str, list] = {
        "schema_version": [t.schema_version for t in trajectories],
        "run_id": [t.run_id for t in trajectories],
        "step": [t.step for t in trajectories],
        "policy_version": [t.policy_version for t in trajectories],
        **_task_columns([t.task for t in trajectories]),
        "sample_idx": [c.sample_idx for c in completions],
        "completion_policy_version": [c.policy_version for c in completions],
        "completion_text": [c.text for c in completions],
        "prompt_token_ids": [c.prompt_token_ids for c in completions],
        "token_ids": [c.token_ids for c in completions],
        "logprobs": [c.logprobs for c in completions],
        "finish_reason": [c.finish_reason for c in completions],
        "reward": [v.reward if v else None for v in verdicts],
        "passed": [v.passed if v else None for v in verdicts],
        "reason": [VerdictReason(v.reason).value if v else None for v in verdicts],
        "detail": [v.detail if v else None for v in verdicts],
        "verify_duration_s": [v.duration_s if v else None for v in verdicts],
        "verifier_version": [v.verifier_version if v else None for v in verdicts],
        "advantage": [t.advantage for t in trajectories],
        "loss_mask": [c.loss_mask for c in completions],
    }
    return pa.Table.from_arrays([pa.array(columns[field.name], field.type) for field in TRAJECTORY_SCHEMA],
                                schema=TRAJECTORY_SCHEMA)


def to_part_table(trajectories: list[Trajectory], run_id: str, step: int) -> pa.Table:
    """Trajectories of one (run_id, step) -> a table with PART_SCHEMA (the path carries the rest)."""
    strays = sorted({(t.run_id, t.step) for t in trajectories} - {(run_id, step)})
    if strays:
        raise ValueError(f"a part of run {run_id!r} step {step} cannot hold rows of (run, step) {strays}")
    return to_table(trajectories).drop_columns(list(PARTITION_COLUMNS))


def with_partition_columns(table: pa.Table, run_id: str, step: int,
                           names: tuple[str, ...] | list[str] = tuple(TRAJECTORY_SCHEMA.names)) -> pa.Table:
    """A part's table (PART_SCHEMA, or a version 1 part that still holds run_id and step)
    -> TRAJECTORY_SCHEMA (or its columns `names`, in that order), run_id and step filled
    from its path."""
    def filled(name: str) -> pa.Array:
        if name == "run_id":
            return pa.array([run_id] * table.num_rows, pa.string())
        if name == "step":
            return pa.array([step] * table.num_rows, pa.int64())
        if name in OPTIONAL_COLUMNS:
            return pa.nulls(table.num_rows, TRAJECTORY_SCHEMA.field(name).type)
        raise ValueError(f"a part of run {run_id!r} step {step} lacks the column {name!r}")

    columns = [table.column(name) if name in table.column_names else filled(name) for name in names]
    schema = pa.schema([TRAJECTORY_SCHEMA.field(name) for name in names])
    return pa.Table.from_arrays(columns, names=list(names)).cast(schema)


def from_table(table: pa.Table) -> list[Trajectory]:
    """A table with TRAJECTORY_SCHEMA's columns (any order, extra columns ignored) -> rows.
    Rows with the same task columns share one Task object (a group's rows: one JSON decode
    of its metadata, not one per row)."""
    missing = [name for name in TRAJECTORY_SCHEMA.names if name not in table.column_names and name not in OPTIONAL_COLUMNS]
    if missing:
        raise ValueError(f"table lacks trajectory columns: {missing}")
    c = {name: table.column(name).to_pylist() if name in table.column_names else [None] * table.num_rows
         for name in TRAJECTORY_SCHEMA.names}
    task_keys = zip(c["task_id"], c["domain"], c["prompt"], c["verifier_kind"], c["verifier_payload"],
                    c["reference_answer"], c["task_metadata"])
    tasks: dict[tuple, Task] = {}
    trajectories = []
    for i, key in enumerate(task_keys):
        task = tasks.get(key)
        if task is None:
            task = tasks[key] = Task(task_id=key[0], domain=key[1], prompt=key[2],
                                     verifier=VerifierSpec(kind=key[3], payload=key[4]),
                                     reference_answer=key[5], metadata=_metadata_from_json(key[6]))
        completion = Completion(
            task_id=key[0],
            sample_idx=c["sample_idx"][i],
            text=c["completion_text"][i],
            prompt_token_ids=tuple(c["prompt_token_ids"][i]),
            token_ids=tuple(c["token_ids"][i]),
            logprobs=tuple(c["logprobs"][i]),
            finish_reason=c["finish_reason"][i],
            policy_version=c["completion_policy_version"][i],
            loss_mask=None if c["loss_mask"][i] is None else tuple(c["loss_mask"][i]),
        )
        verdict = None if c["reason"][i] is None else Verdict(
            reward=c["reward"][i],
            passed=c["passed"][i],
            reason=VerdictReason(c["reason"][i]),
            detail=c["detail"][i],
            duration_s=c["verify_duration_s"][i],
            verifier_version=c["verifier_version"][i],
        )
        trajectories.append(Trajectory(run_id=c["run_id"][i], step=c["step"][i], policy_version=c["policy_version"][i],
                                       task=task, completion=completion, verdict=verdict, advantage=c["advantage"][i],
                                       schema_version=c["schema_version"][i]))
    return trajectories
