"""configs/smollm2_math.toml builds: every domain's held-out questions are distinct and as
many as envs.heldout_size, disjoint from training, their reference answers pass the strict
verifier and the format-free scorer (every domain has numeric answers) and survive the stop
strings; the run's seed does not move the held-out set. What it does not: load the model
(tests/flows/test_smollm2_math_run.py runs one step where `make smollm2` fetched it)."""

from pathlib import Path

import pytest

from rlpipe.controller.evaluation import heldout_tasks
from rlpipe.controller.sample import build_mixture
from rlpipe.core.config import load_config
from rlpipe.envs.format_free import format_free_passed

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "smollm2_math.toml"


@pytest.fixture(scope="module")
def heldout():
    config = load_config(CONFIG)
    mixture = build_mixture(config)
    return config, mixture, heldout_tasks(config, mixture)


def test_each_domain_has_its_heldout_size_of_distinct_questions_none_in_training(heldout):
    config, mixture, tasks = heldout
    for domain in config.envs.domains:
        prompts = {task.prompt for task in tasks if task.domain == domain}
        assert len(prompts) == config.envs.heldout_size, domain
        train = {task.prompt for task in mixture.envs[domain].tasks("train", 500, seed=config.seed)}
        assert not prompts & train, domain


def test_reference_answers_pass_strict_and_format_free_and_survive_the_stops(heldout):
    config, mixture, tasks = heldout
    for task in tasks[:: max(1, len(tasks) // 60)]:
        assert mixture.env_for(task).verify(task, task.reference_answer).passed, task.prompt
        assert format_free_passed(task, f"The answer is {task.reference_answer}.") is True
        assert not any(stop in task.reference_answer for stop in config.rollout.stop)


def test_another_run_seed_keeps_the_heldout_set(heldout):
    config, mixture, tasks = heldout
    other = config.model_copy(update={"seed": config.seed + 1})
    assert [task.task_id for task in heldout_tasks(other, mixture)] == [task.task_id for task in tasks]
