"""Turn stored trajectories into trainer samples (the only input the update needs), so
an update replays exactly from the lake without re-sampling or re-verification."""

from __future__ import annotations

from rlpipe.core.errors import ConfigError
from rlpipe.core.records import SCHEMA_VERSION, Trajectory
from rlpipe.rl.batching import TrainSample


def train_samples(rows: list[Trajectory]) -> list[TrainSample]:
    """One sample per row, in (task_id, sample_idx) order; rows without an advantage
    (reward could not be scored) are left out. Rows of an older schema version (other
    logprob convention, see engines/base.py) raise ConfigError: they must not train."""
    old = [row.schema_version for row in rows if row.schema_version != SCHEMA_VERSION]
    if old:
        raise ConfigError(
            f"{len(old)} trajectories of schema version {old[0]} reached the trainer, which needs version {SCHEMA_VERSION}",
            f"start a new run; runs from before version {SCHEMA_VERSION} stored temperature-1 logprobs",
        )
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
