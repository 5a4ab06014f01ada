"""configs/smollm2.toml loads, names the model file where `make smollm2` writes it, and its
domain builds and asks in a form whose reference answers verify and survive the stop
strings. What it does not: load the model (it is fetched by `make smollm2`, not in CI) or
restate the config's numbers."""

import re
from pathlib import Path

from rlpipe.core.config import load_config
from rlpipe.envs.mixture import build_env

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "smollm2.toml"


def makefile_variable(name: str) -> str:
    """A `NAME := value` of the Makefile, with the $(VAR) references in it expanded."""
    text = (REPO / "Makefile").read_text()
    value = re.search(rf"^{name}\s*:=\s*(.+)$", text, re.MULTILINE).group(1).strip()
    return re.sub(r"\$\((\w+)\)", lambda match: makefile_variable(match.group(1)), value)


def test_the_config_names_the_file_make_smollm2_writes():
    assert load_config(CONFIG).model.gguf == makefile_variable("SMOLLM2_GGUF")


def test_the_domain_builds_and_its_reference_answers_verify_and_survive_the_stops():
    config = load_config(CONFIG)
    for name in config.envs.domains:
        env = build_env(name, max_operand=config.envs.max_operand)
        task = env.tasks("heldout", 1, seed=config.seed)[0]
        assert env.verify(task, task.reference_answer).passed
        # The one-line answer ends at the first stop string, so it must not contain one.
        assert not any(stop in task.reference_answer for stop in config.rollout.stop)
