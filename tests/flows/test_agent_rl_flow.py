"""Agent RL through `rlpipe train`'s flow: configs/agent_quickstart.toml, shrunk to 2 steps of
2 tasks x 2 episodes, warm-started on oracle episodes. Every row is one whole episode, judged
by the verifier in its sandbox, with the tool output masked: the update trains exactly the
reply tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpipe.controller.builders import build_lake
from rlpipe.core.config import load_config
from rlpipe.envs.agent_tasks import AgentTasksEnv
from rlpipe.flows.train import train
from rlpipe.rl.checkpoint import load_trainer_state
from rlpipe.rl.checkpoint_layout import OPTIMIZER_FILE
from rlpipe.storage.query import query_trajectories
from tests.helpers.mlflow_db import seed_mlflow_db
from tests.sandbox._bwrap_support import require_bwrap

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "agent_quickstart.toml"


@pytest.mark.bwrap
@pytest.mark.slow
@pytest.mark.timeout(1200)  # 22 s quiet, once 250 s at load 15: twice the suite's hang guard
def test_two_agent_rl_steps_store_whole_masked_episodes(tmp_path: Path) -> None:
    require_bwrap()
    seed_mlflow_db(tmp_path / "mlflow.db")
    config = load_config(CONFIG, [
        f'storage.lake_uri="{tmp_path / "lake"}"', f'tracking.mlflow_uri="sqlite:///{tmp_path / "mlflow.db"}"',
        "train.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=24",
        "warmstart.steps=2", "envs.train_size=4", "envs.heldout_size=2", "sandbox.pool_size=4",
    ])
    summary = train(config, "agent-rl")
    lake = build_lake(config)
    assert summary.steps_committed == 2
    rows = query_trajectories(lake, "select step, domain, reason, reward, advantage, verifier_version, token_ids, "
                                    "logprobs, loss_mask from trajectories order by step, task_id, sample_idx").rows
    assert len(rows) == 2 * 2 * 2  # steps x prompts x group, one row per episode
    version = AgentTasksEnv().verifier_version
    trained_tokens = {1: 0, 2: 0}
    for step, domain, reason, reward, advantage, verifier_version, token_ids, logprobs, loss_mask in rows:
        assert domain == "agent_tasks" and reason in ("ok", "wrong") and reward in (0.0, 1.0)
        assert verifier_version == version and advantage is not None
        assert len(loss_mask) == len(token_ids) == len(logprobs) and loss_mask[0] == 1  # the episode opens with a reply
        assert all(logprob == 0.0 for logprob, bit in zip(logprobs, loss_mask) if bit == 0)
        trained_tokens[step] += sum(loss_mask)
    # episodes that went on past their first reply hold tool output (masked) between replies
    assert any(0 in row[-1] for row in rows)
    metrics = query_trajectories(lake, "select step, tokens from step_metrics order by step").rows
    assert [(step, int(tokens)) for step, tokens in metrics] == sorted(trained_tokens.items())
    after = lake.read_json("agent-rl", "evals/after_rl.json")
    assert after["accuracy/agent_tasks"] in (0.0, 0.5, 1.0)
    # the one family's figure is the domain's, and each held-out task's outcome is stored for a paired comparison
    assert after["family/agent_tasks/lookup"] == after["accuracy/agent_tasks"] and after["n/agent_tasks/lookup"] == 2
    outcomes = [value for key, value in after.items() if key.startswith("task/agent_tasks/")]
    assert len(outcomes) == 2 and sum(outcomes) / 2 == after["accuracy/agent_tasks"]
    # warmstart.keep_optimizer: the warm start stepped the RL trainer's AdamW, so checkpoint 0
    # holds its 2 steps of second moments, momentum zeroed, for RL to go on with
    saved = tmp_path / "lake" / "checkpoints" / "agent-rl" / "step=000000" / OPTIMIZER_FILE
    states = list(load_trainer_state(saved, str(saved))["state"].values())
    assert states and {int(state["step"]) for state in states} == {2}
    assert all(not state["exp_avg"].any() for state in states) and any(state["exp_avg_sq"].any() for state in states)
