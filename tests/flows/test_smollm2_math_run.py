"""One RL step of configs/smollm2_math.toml on the real SmolLM2-135M-Instruct (4 prompts,
4 held-out questions per domain): every row is committed and both evaluations hold each
domain's strict and format-free accuracy over the tasks scored. Runs only where `make
smollm2` fetched the GGUF (skipped otherwise, with the reason)."""

from pathlib import Path

import pytest

from rlpipe.controller.builders import build_lake
from rlpipe.core.config import load_config
from rlpipe.flows.train import train
from rlpipe.storage.heldout_evaluations import read_heldout_evaluations
from tests.helpers.mlflow_db import seed_mlflow_db

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "smollm2_math.toml"
GGUF = REPO / load_config(CONFIG).model.gguf


@pytest.mark.timeout(1800)  # a 135M model on a loaded 2-core machine: above the suite's 600 s hang guard
@pytest.mark.skipif(not GGUF.is_file(), reason=f"SmolLM2 GGUF not fetched ({GGUF}); run `make smollm2`")
def test_one_rl_step_of_the_math_recipe_commits_its_rows_and_scores_both_ways(tmp_path: Path) -> None:
    seed_mlflow_db(tmp_path / "mlflow.db")
    config = load_config(CONFIG, [
        f'model.gguf="{GGUF}"', "train.steps=1", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "rollout.batch_size=16", "train.micro_batch_size=16", "envs.heldout_size=4",
        f'storage.lake_uri="{tmp_path / "lake"}"', f'tracking.mlflow_uri="sqlite:///{tmp_path / "mlflow.db"}"',
    ])
    train(config, "math")
    lake = build_lake(config)
    assert lake.committed_steps("math") == [1]
    assert lake.read_manifest("math", 1).rows == 4 * 4
    evaluations = read_heldout_evaluations(lake, "math", default_count=0)
    assert [(e.name, e.policy_version) for e in evaluations] == [("before_rl", 0), ("after_rl", 1)]
    for evaluation in evaluations:
        assert {score.domain for score in evaluation.domains} == set(config.envs.domains)
        for score in evaluation.domains:
            assert score.count == 4 and score.format_free is not None  # every domain's answers are numbers
