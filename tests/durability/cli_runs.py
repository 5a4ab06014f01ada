"""Helpers for durability tests: run the real `rlpipe` CLI in a subprocess with a small
config, and read a finished run back (rows, manifests, final weights, MLflow history)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from rlpipe.core.config import RunConfig, load_config
from rlpipe.storage.lake import Lake
from rlpipe.storage.query import query_trajectories
from tests.helpers.mlflow_db import seed_mlflow_db
from tests.helpers.cli_zygote import run_rlpipe_command

RLPIPE = [sys.executable, "-m", "rlpipe.cli.main"]
REPO_ROOT = Path(__file__).resolve().parents[2]

# 5 steps x 4 prompts x 4 samples = 80 rows; checkpoints at steps 0, 2, 4 and 5 (final), so a
# kill in step 4 resumes from checkpoint 2 and replays step 3 (and 4 once it is committed).
SMALL_TOML = """\
seed = 7
[train]
steps = 5
[rollout]
prompts_per_step = 4
group_size = 4
[warmstart]
steps = 5
batch_size = 16
[envs]
train_size = 200
heldout_size = 8
domains = {arithmetic = 0.5, reverse = 0.5}
[checkpoint]
every_steps = 2
"""
SMALL_STEPS, SMALL_ROWS = 5, 5 * 4 * 4


@dataclass(frozen=True)
class Where:
    """One run's private places: config file, lake, MLflow store, Prefect home."""

    folder: Path
    config_path: Path

    @property
    def lake_uri(self) -> str:
        return str(self.folder / "lake")

    def config(self) -> RunConfig:
        return load_config(self.config_path, [])

    def lake(self) -> Lake:
        return Lake.open(self.lake_uri)


def make_where(folder: Path, toml: str = SMALL_TOML, lake_uri: str | None = None, extra: str = "") -> Where:
    folder.mkdir(parents=True, exist_ok=True)
    lake = lake_uri or str(folder / "lake")
    text = (
        toml + extra + f'\n[storage]\nlake_uri = "{lake}"\n'
        f'[tracking]\nmlflow_uri = "sqlite:///{folder / "mlflow.db"}"\n'
    )
    path = folder / "config.toml"
    path.write_text(text)
    seed_mlflow_db(folder / "mlflow.db")  # migrated once per test process, not once per run
    return Where(folder, path)


def cli_env(where: Where, prefect_api_url: str | None, failpoints: str | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RLPIPE_FAILPOINTS", None)
    env.update(
        PREFECT_HOME=str(where.folder / "prefect-home"),  # task results (the stage cache) live here
        RLPIPE_HOME=str(where.folder / "rlpipe-home"),
        PREFECT_LOGGING_LEVEL="WARNING",
        OMP_NUM_THREADS="1",  # the same thread count in every run: bit-equal float reductions
        MKL_NUM_THREADS="1",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        PYTHONPATH=str(REPO_ROOT),
    )
    if prefect_api_url:
        env["PREFECT_API_URL"] = prefect_api_url
    if failpoints:
        env["RLPIPE_FAILPOINTS"] = failpoints
    env.update(extra)
    return env


def run_cli(args: list[str], env: dict[str, str], cwd: Path, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return run_rlpipe_command(args, env, cwd, timeout_s)


def rows_by_key(lake: Lake, run_id: str) -> dict[tuple[int, str, int], tuple[str, float | None, float | None]]:
    """(step, task_id, sample_idx) -> (completion text, reward, advantage), through DuckDB
    over committed manifests (what `rlpipe query` reads)."""
    result = query_trajectories(
        lake,
        f"select step, task_id, sample_idx, completion_text, reward, advantage from trajectories "
        f"where run_id = '{run_id}' order by 1, 2, 3",
    )
    return {(int(r[0]), str(r[1]), int(r[2])): (r[3], r[4], r[5]) for r in result.rows}


def count_rows(lake: Lake, run_id: str) -> tuple[int, int]:
    """(rows, distinct (run_id, step, task_id, sample_idx)) as `rlpipe query` counts them."""
    result = query_trajectories(
        lake,
        f"select count(*), count(distinct (run_id, step, task_id, sample_idx)) from trajectories where run_id = '{run_id}'",
    )
    return tuple(int(value) for value in result.rows[0])  # type: ignore[return-value]


def final_weights(lake: Lake, run_id: str, step: int, into: Path) -> dict[str, torch.Tensor]:
    """The tensors of model.safetensors of checkpoint `step`, downloaded from the lake."""
    from rlpipe.rl.checkpoint import WEIGHTS_FILE

    info = lake.load_checkpoint(run_id, step, into)
    assert info is not None, f"no complete checkpoint {step} of {run_id}"
    return load_file(str(into / WEIGHTS_FILE))


def checkpoint_file_count(folder: Path) -> int:
    """How many files one checkpoint of the small config uploads (checkpoint-write hits)."""
    from rlpipe.rl.checkpoint import CheckpointMeta, save_checkpoint
    from rlpipe.workers.builders import build_policy, build_trainer

    config = load_config(None, ["train.steps=1"])
    policy, tokenizer = build_policy(config)
    save_checkpoint(folder, policy, tokenizer, build_trainer(config, policy).state_dict(), CheckpointMeta(0, 0, "probe"))
    return sum(1 for path in folder.rglob("*") if path.is_file())
