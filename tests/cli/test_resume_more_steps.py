"""Resuming a run with a new train.steps extends it (and says so), through the real CLI:
2 steps, then `train CONFIG --resume RUN --set train.steps=3`, then `resume RUN --set
train.steps=4`. Resuming a finished run as it is answers at once that it finished. The final held-out evaluation is taken again for the longer run; what the run
computes may not change on a resume, and no committed step may be dropped.

The run folder is nested past 200 characters and the console is 40 columns wide: the train
summary must still print the lake's path whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlpipe.storage.lake import Lake
from tests.cli.cli_process import error_lines, run_rlpipe
from tests.durability.cli_runs import count_rows
from tests.helpers.mlflow_db import seed_mlflow_db

pytestmark = pytest.mark.slow

# The quickstart's task and recipe, made small: 8 prompts x 2 samples per step, a 5-step
# warm-start with no accuracy target, 8 held-out tasks.
SMALL_QUICKSTART = """\
[model]
max_position_embeddings = 32
[envs]
domains = {{ reverse = 1.0 }}
max_word_len = 5
heldout_size = 8
[warmstart]
steps = 5
batch_size = 16
[rollout]
prompts_per_step = 8
group_size = 2
max_new_tokens = 6
temperature = 0.7
[train]
steps = 2
lr = 1e-3
[storage]
lake_uri = "{lake}"
[tracking]
mlflow_uri = "sqlite:///{mlflow}"
"""
ROWS_PER_STEP = 8 * 2  # prompts_per_step x group_size


def test_resume_with_more_steps_extends_the_run_and_evaluates_it_again(long_tmp: Path, prefect_api_url: str) -> None:
    lake_path, run_id = long_tmp / "lake", "extend-me"
    config = long_tmp / "small.toml"
    config.write_text(SMALL_QUICKSTART.format(lake=lake_path, mlflow=long_tmp / "mlflow.db"))
    seed_mlflow_db(long_tmp / "mlflow.db")  # migrated once per test process, not by the first run
    env = dict(PREFECT_API_URL=prefect_api_url, PREFECT_HOME=str(long_tmp / "prefect-home"),
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")

    first = run_rlpipe(["train", str(config), "--run-id", run_id], long_tmp, timeout_s=600, **env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert str(lake_path) in first.stdout  # the summary names the lake whole, at 40 columns
    lake = Lake.open(str(lake_path))
    before_rl = lake.read_json(run_id, "evals/before_rl.json")
    assert lake.read_json(run_id, "evals/after_rl.json")["policy_version"] == 2

    # A finished run resumed as it is: answered from the lake, nothing started, nothing written.
    status = lake.read_status(run_id)
    finished = run_rlpipe(["resume", run_id, "--lake", str(lake_path)], long_tmp, **env)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert f"run {run_id} already finished at step 2 of 2, held-out accuracy" in finished.stdout, finished.stdout
    assert lake.read_status(run_id) == status  # no flow ran: it would have rewritten status.json
    assert "finished run" not in finished.stdout  # no train summary, as if it had trained

    extended = run_rlpipe(["train", str(config), "--resume", run_id, "--set", "train.steps=3"], long_tmp, timeout_s=600, **env)
    assert extended.returncode == 0, extended.stderr[-3000:]
    assert f"extending run {run_id} from 2 to 3 steps" in extended.stdout
    assert lake.committed_steps(run_id) == [1, 2, 3]
    assert count_rows(lake, run_id) == (3 * ROWS_PER_STEP, 3 * ROWS_PER_STEP)  # 48 rows, none twice
    assert lake.read_json(run_id, "evals/after_rl.json")["policy_version"] == 3  # evaluated again, after step 3
    assert lake.read_json(run_id, "evals/before_rl.json") == before_rl  # the warm-started policy's, kept
    assert json.loads(lake.read_run_info(run_id).config_json)["train"]["steps"] == 3
    assert lake.latest_checkpoint(run_id) == 3

    # `rlpipe resume RUN` takes --set too (the run's stored config, now 3 steps, plus the change)
    again = run_rlpipe(["resume", run_id, "--lake", str(lake_path), "--set", "train.steps=4"], long_tmp, timeout_s=600, **env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"extending run {run_id} from 3 to 4 steps" in again.stdout
    assert count_rows(lake, run_id) == (4 * ROWS_PER_STEP, 4 * ROWS_PER_STEP)
    assert lake.read_json(run_id, "evals/after_rl.json")["policy_version"] == 4

    fewer = run_rlpipe(["resume", run_id, "--lake", str(lake_path), "--set", "train.steps=3"], long_tmp, **env)
    assert fewer.returncode == 2, fewer.stderr
    error, hint = error_lines(fewer)
    assert "has 4 steps committed; train.steps=3 would drop some" in error and "train.steps >= 4" in hint

    other = run_rlpipe(["resume", run_id, "--lake", str(lake_path), "--set", "algo.clip_eps=0.3"], long_tmp, **env)
    assert other.returncode == 2, other.stderr
    error, hint = error_lines(other)
    assert "algo.clip_eps 0.2 -> 0.3" in error and "train.steps" in hint
    assert count_rows(lake, run_id) == (4 * ROWS_PER_STEP, 4 * ROWS_PER_STEP)  # refused before anything ran
