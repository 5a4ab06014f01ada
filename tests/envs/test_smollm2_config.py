"""configs/smollm2.toml is a valid config whose domain builds and asks in the chat format
the shipped model answers in; the model file itself is fetched by `make smollm2`."""

from pathlib import Path

from rlpipe.core.config import load_config
from rlpipe.envs.mixture import build_env

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "smollm2.toml"


def test_smollm2_config_loads_and_its_domain_builds():
    config = load_config(CONFIG)
    assert config.model.gguf == "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # where `make smollm2` puts it
    assert config.model.prompt_format == "chat" and config.warmstart.steps == 0
    assert config.algo.kl_coef == 0  # no reference copy of the 135M model
    for name in config.envs.domains:
        env = build_env(name, max_operand=config.envs.max_operand)
        task = env.tasks("heldout", 1, seed=config.seed)[0]
        assert env.verify(task, task.reference_answer).passed
        # The one-line answer ends at the first stop string, so it must not contain one.
        assert not any(stop in task.reference_answer for stop in config.rollout.stop)
