"""Helpers for flow tests: a small config in a temp folder, and reading a run back."""

from __future__ import annotations

from pathlib import Path

from rlpipe.core.config import RunConfig, load_config
from tests.helpers.mlflow_db import seed_mlflow_db

TINY = [
    "train.steps=3",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "warmstart.steps=5",
    "envs.heldout_size=10",
    "envs.domains={arithmetic = 0.5, reverse = 0.5}",
]


def tiny_config(tmp_path: Path, *overrides: str) -> RunConfig:
    where = [f'storage.lake_uri="{tmp_path / "lake"}"', f'tracking.mlflow_uri="sqlite:///{tmp_path / "mlflow.db"}"']
    seed_mlflow_db(tmp_path / "mlflow.db")  # migrated once per test process, not once per run
    return load_config(None, TINY + where + list(overrides))
