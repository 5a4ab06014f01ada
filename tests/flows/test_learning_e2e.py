"""One small end-to-end training run on CPU, through the real flow: the reward goes up and
the lake holds exactly the rows it should. The full-size version is configs/quickstart.toml
(see README.md); this one keeps the same recipe at a size CI can afford."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpipe.core.config import load_config
from rlpipe.flows.train import train
from rlpipe.storage.query import query_trajectories
from rlpipe.tasks.builders import build_lake

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml"
STEPS, PROMPTS, GROUP = 10, 64, 8


@pytest.mark.slow
def test_small_quickstart_learns_and_stores_every_row(tmp_path: Path) -> None:
    config = load_config(
        QUICKSTART,
        [
            f"train.steps={STEPS}",
            f"rollout.prompts_per_step={PROMPTS}",
            f"rollout.group_size={GROUP}",
            "train.mini_batches_per_step=2",
            "envs.heldout_size=100",
            f'storage.lake_uri="{tmp_path / "lake"}"',
            f'tracking.mlflow_uri="sqlite:///{tmp_path / "mlflow.db"}"',
        ],
    )
    summary = train(config.model_dump_json(), "learn")
    lake = build_lake(config)

    # Rows: steps x prompts x group, each (run, step, task, sample) once.
    counts = query_trajectories(
        lake, "select count(*), count(distinct (run_id, step, task_id, sample_idx)) from trajectories"
    ).rows
    assert counts == [(STEPS * PROMPTS * GROUP, STEPS * PROMPTS * GROUP)]

    # Reward trend: the last three steps' mean reward beats the first three's.
    rewards = dict(query_trajectories(lake, "select step, avg(reward) from trajectories group by step").rows)
    first = sum(rewards[step] for step in (1, 2, 3)) / 3
    last = sum(rewards[step] for step in (STEPS - 2, STEPS - 1, STEPS)) / 3
    assert last > first + 0.03, rewards

    # The warm-start stopped near its target, and RL did not make the policy worse.
    assert summary.accuracy_before_rl >= 0.2
    assert summary.accuracy_after_rl >= summary.accuracy_before_rl
