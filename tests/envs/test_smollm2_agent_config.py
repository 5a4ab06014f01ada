"""configs/smollm2_agent.toml builds: every family is drawn in both splits, held-out tasks are
none of the training tasks, the episodes go through the chat template with the engine fed
plain text, no oracle reply holds the stop string, and (where `make smollm2` fetched the
model) every oracle reply with its end of turn fits rollout.max_new_tokens of SmolLM2's
tokens. What it does not: run the model (docs/RESULTS.md "SmolLM2 as an agent")."""

import json
from pathlib import Path

import pytest

from rlpipe.controller.evaluation import heldout_tasks
from rlpipe.controller.sample import build_mixture
from rlpipe.core.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "smollm2_agent.toml"
GGUF = REPO / load_config(CONFIG).model.gguf


@pytest.fixture(scope="module")
def built():
    config = load_config(CONFIG)
    mixture = build_mixture(config)
    return config, mixture, heldout_tasks(config, mixture)


def family(task) -> str:
    return json.loads(task.verifier.payload).get("family", "lookup")


def test_every_family_is_in_both_splits_and_no_heldout_task_is_trained_on(built):
    config, mixture, heldout = built
    env = mixture.envs["agent_tasks"]
    train = env.tasks("train", config.envs.train_size, seed=config.seed)
    assert {family(task) for task in heldout} == {family(task) for task in train} == set(config.envs.agent_families)
    assert len(heldout) == config.envs.heldout_size
    assert not {task.task_id for task in heldout} & {task.task_id for task in train}


def test_episodes_are_chat_rendered_and_no_oracle_reply_holds_the_stop(built):
    config, mixture, heldout = built
    assert config.envs.agent_chat_template and config.model.prompt_format == "plain"
    env = mixture.envs["agent_tasks"]
    assert all(stop not in reply for task in heldout for reply in env.oracle_turns(task) for stop in config.rollout.stop)


@pytest.mark.skipif(not GGUF.is_file(), reason=f"SmolLM2 GGUF not fetched ({GGUF}); run `make smollm2`")
def test_every_oracle_reply_fits_max_new_tokens(built):
    from transformers import AutoTokenizer

    from rlpipe.rl.gguf_folder import converted_folder_in_child

    config, mixture, heldout = built
    tokenizer = AutoTokenizer.from_pretrained(converted_folder_in_child(GGUF))  # converted here when no test did yet
    env = mixture.envs["agent_tasks"]
    longest = max(len(tokenizer(reply + config.rollout.stop[0], add_special_tokens=False)["input_ids"])
                  for task in heldout for reply in env.oracle_turns(task))
    assert longest <= config.rollout.max_new_tokens
