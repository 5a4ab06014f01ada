"""Turn stored trajectories into trainer samples (the only input the update needs), so
an update replays exactly from the lake without re-sampling or re-verification."""

from __future__ import annotations

from rlpipe.core.records import Trajectory
from rlpipe.rl.batching import TrainSample


def train_samples(rows: list[Trajectory]) -> list[TrainSample]:
    """One sample per row, in (task_id, sample_idx) order; rows without an advantage
    (reward could not be scored) are left out."""
    ordered = sorted(rows, key=lambda row: (row.task.task_id, row.completion.sample_idx))
    return [
        TrainSample(
            prompt_token_ids=row.completion.prompt_token_ids,
            token_ids=row.completion.token_ids,
            old_logprobs=row.completion.logprobs,
            advantage=row.advantage,
        )
        for row in ordered
        if row.advantage is not None
    ]
