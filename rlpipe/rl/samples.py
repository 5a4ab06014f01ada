"""Turn stored trajectories into trainer samples (the only input the update needs), so
an update replays exactly from the lake without re-sampling or re-verification.

Two ways in, giving equal samples: `train_samples` from Trajectory rows (the reference
path: tests, benchmarks/stage_ceiling.py) and `train_samples_from_table` from the Arrow
columns of committed parts (the trainer worker's update, which reads only `TRAIN_COLUMNS`
and makes no Trajectory row: on a 1024-row step that was most of the time of reading the
part back; the metadata JSON and verdict columns, which it does not use, are not decoded).

Not here: which rows are fresh enough to train on (rl/staleness.py), reading parts
(storage/lake.py).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from rlpipe.core.errors import ConfigError
from rlpipe.core.records import SCHEMA_VERSION, Trajectory
from rlpipe.rl.batching import TrainSample

TRAIN_COLUMNS = ("schema_version", "policy_version", "task_id", "domain", "sample_idx",
                 "prompt_token_ids", "token_ids", "logprobs", "advantage", "loss_mask")
"""The trajectory columns the trainer worker's update reads: the samples, the staleness
guard (policy_version) and the per-domain gradient conflict (domain)."""


def train_samples(rows: list[Trajectory]) -> list[TrainSample]:
    """One sample per row, in (task_id, sample_idx) order; rows without an advantage
    (reward could not be scored) are left out. Rows of an older schema version (other
    logprob convention, see engines/base.py) raise ConfigError: they must not train."""
    _refuse_old_versions([row.schema_version for row in rows])
    ordered = sorted(rows, key=lambda row: (row.task.task_id, row.completion.sample_idx))
    return [
        TrainSample(
            prompt_token_ids=row.completion.prompt_token_ids,
            token_ids=row.completion.token_ids,
            old_logprobs=row.completion.logprobs,
            advantage=row.advantage,
            loss_mask=row.completion.loss_mask,
        )
        for row in ordered
        if row.advantage is not None
    ]


def train_samples_from_table(table: pa.Table) -> list[TrainSample]:
    """`train_samples` of the rows of `table` (TRAJECTORY_SCHEMA's types, at least
    TRAIN_COLUMNS), straight from its columns: the same samples in the same order."""
    _refuse_old_versions(table.column("schema_version").to_pylist())
    ordered = table.sort_by([("task_id", "ascending"), ("sample_idx", "ascending")])  # stable, as sorted()
    scored = ordered.filter(pc.is_valid(ordered.column("advantage")))
    columns = [scored.column(name).to_pylist() for name in ("prompt_token_ids", "token_ids", "logprobs", "advantage", "loss_mask")]
    return [
        TrainSample(prompt_token_ids=tuple(prompt), token_ids=tuple(tokens), old_logprobs=tuple(logprobs),
                    advantage=advantage, loss_mask=None if mask is None else tuple(mask))
        for prompt, tokens, logprobs, advantage, mask in zip(*columns)
    ]


def _refuse_old_versions(versions: list[int]) -> None:
    old = [version for version in versions if version != SCHEMA_VERSION]
    if old:
        raise ConfigError(
            f"{len(old)} trajectories of schema version {old[0]} reached the trainer, which needs version {SCHEMA_VERSION}",
            f"start a new run; runs from before version {SCHEMA_VERSION} stored temperature-1 logprobs",
        )
