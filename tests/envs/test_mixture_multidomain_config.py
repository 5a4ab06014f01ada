"""configs/multidomain.toml: four or more domains, the curriculum on, prompts that fit the
tiny model, and every domain's reference answers accepted by its verifier."""

from pathlib import Path

from rlpipe.controller.preflight import preflight
from rlpipe.controller.sample import build_mixture
from rlpipe.core.config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "multidomain.toml"


def test_the_multidomain_config_builds_and_its_references_pass(tmp_path):
    config = load_config(CONFIG, [f'storage.lake_uri="{tmp_path / "lake"}"'])
    assert config.curriculum.enabled and len(config.envs.domains) >= 4
    preflight(config)  # domains build; longest prompt + max_new_tokens fits max_position_embeddings
    mixture = build_mixture(config)
    for name, env in mixture.envs.items():
        tasks = env.tasks("train", 20, seed=0) + env.tasks("heldout", 20, seed=0)
        assert all(env.verify(task, task.reference_answer).reward == 1.0 for task in tasks), name
