"""The pre-flight refuses a local lake whose disk cannot hold what the run will keep: exit 2,
one error line naming the folder, the need and the free space, and nothing created."""

from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlpipe.cli.main import app
from rlpipe.core.config import load_config
from rlpipe.rl.checkpoint_size import checkpoint_size
from rlpipe.storage import disk_space
from rlpipe.storage.disk_space import disk_need, kept_checkpoints

Usage = namedtuple("Usage", "total used free")


def test_a_disk_too_small_is_refused_before_anything_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lake = tmp_path / "lake"
    config = tmp_path / "run.toml"
    config.write_text(f'[storage]\nlake_uri = "{lake}"\n[tracking]\nmlflow_uri = "sqlite:///{tmp_path / "mlflow.db"}"\n')
    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 1000, 1000))
    result = CliRunner().invoke(app, ["train", str(config), "--run-id", "small-disk"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    assert str(lake) in errors[0] and "needs about" in errors[0] and "0.0 MB free" in errors[0]
    assert not lake.exists() and not (tmp_path / "mlflow.db").exists()


def test_the_estimate_counts_weights_adamw_and_what_retention_keeps(tmp_path: Path) -> None:
    config = load_config(None, [f'storage.lake_uri="{tmp_path}"', "train.steps=100", "checkpoint.every_steps=4",
                                "checkpoint.keep_last=3"])
    size = checkpoint_size(config)
    assert size.weights_bytes == size.parameters * 4 and size.optimizer_bytes == size.parameters * 8  # float32: 1 + 2 moments
    assert kept_checkpoints(config) == 3 + 1 + 1  # the newest 3, the one being written, the best
    kl = config.model_copy(update={"algo": config.algo.model_copy(update={"kl_coef": 0.1})})
    assert kept_checkpoints(kl) == 6  # + checkpoint 0, the KL reference
    every = config.model_copy(update={"checkpoint": config.checkpoint.model_copy(update={"keep_last": 0})})
    assert kept_checkpoints(every) == 100 // 4 + 2
    need = disk_need(config, size.total_bytes)
    assert need.total_bytes == 5 * size.total_bytes + need.rows_bytes and need.rows_bytes > 0
    assert disk_space.check_lake_disk(config, size.total_bytes) == need  # this disk holds a tiny run
    assert shutil.disk_usage(tmp_path).free > need.total_bytes
