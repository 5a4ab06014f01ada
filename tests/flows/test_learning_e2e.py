"""One small end-to-end training run on CPU, through the real flow: the policy gets better
on held-out tasks and the lake holds exactly the rows it should. The full-size version is
configs/quickstart.toml (see README.md); this one is its first STEPS steps, the same recipe
without dynamic sampling (its extra generation rounds would triple the test's generation;
they are tested in tests/rl/test_staleness_and_dynamic_sampling.py, and the quickstart's
five-seed table in docs/RESULTS.md is measured with them).

What is asserted, and why it holds on any machine: the trajectory of a run depends on the
CPU kernels (another reduction order, another thread count, and the sampled completions
diverge after a few steps), so the test asserts on an effect, never on numbers of one
trajectory. The effect is measured on the quickstart's 1000 held-out words, the same words
before and after (paired): if a fifth of the words change outcome between the two
evaluations, the standard deviation of the gain is sqrt(0.2 / 1000) = 1.4 points.
MIN_GAIN (3 points) is half the smallest gain of ten seeds-and-thread-counts measured after
15 steps (docs/RESULTS.md, "The learning tests' gains") and twice the evaluation noise.
The sampled training reward is NOT asserted on: it moves with the
tasks each step drew, and can stand still while held-out accuracy rises.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpipe.controller.builders import build_lake
from rlpipe.core.config import load_config
from rlpipe.flows.train import train
from rlpipe.storage.query import query_trajectories

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml"
STEPS = 15
MIN_GAIN = 0.03  # held-out accuracy points (3); see the module docstring


@pytest.mark.slow
def test_small_quickstart_learns_and_stores_every_row(tmp_path: Path) -> None:
    train_and_check_it_learned(tmp_path, "learn")


def train_and_check_it_learned(tmp_path: Path, run_id: str, *overrides: str) -> None:
    """The small quickstart (with `overrides`): every row once, and the held-out gain."""
    config = load_config(
        QUICKSTART,
        [
            f"train.steps={STEPS}",
            "rollout.dynamic_sampling=false",  # the margins below were measured without it
            f'storage.lake_uri="{tmp_path / "lake"}"',
            f'tracking.mlflow_uri="sqlite:///{tmp_path / "mlflow.db"}"',
            *overrides,
        ],
    )
    summary = train(config, run_id)
    lake = build_lake(config)

    # Rows: steps x prompts x group, each (run, step, task, sample) once.
    expected_rows = STEPS * config.rollout.prompts_per_step * config.rollout.group_size
    counts = query_trajectories(
        lake, "select count(*), count(distinct (run_id, step, task_id, sample_idx)) from trajectories"
    ).rows
    assert counts == [(expected_rows, expected_rows)]

    # The warm-start stopped near its target (30% on training tasks), and RL made the policy
    # better on the same 1000 held-out words by a margin no evaluation noise reaches.
    assert config.envs.heldout_size >= 1000
    assert summary.accuracy_before_rl >= 0.2
    gain = summary.accuracy_after_rl - summary.accuracy_before_rl
    assert gain >= MIN_GAIN, (summary.accuracy_before_rl, summary.accuracy_after_rl)
