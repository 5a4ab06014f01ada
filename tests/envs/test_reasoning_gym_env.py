"""The reasoning-gym adapter (envs/reasoning_gym_env.py): seeded, disjoint splits; the
dataset's own score_answer as a verifier that never raises; config errors as ConfigError;
every dataset of configs/reasoning_gym.toml solvable by its reference answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlpipe.controller.sample import build_mixture
from rlpipe.core.config import load_config
from rlpipe.core.errors import ConfigError
from rlpipe.core.records import VerdictReason
from rlpipe.envs.mixture import build_env
from rlpipe.envs.reasoning_gym_env import ReasoningGymEnv

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "reasoning_gym.toml"


@pytest.fixture(scope="module")
def legs() -> ReasoningGymEnv:
    return ReasoningGymEnv("rg_legs", "leg_counting", {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3})


@pytest.fixture(scope="module")
def shipped_mixture():
    return build_mixture(load_config(CONFIG))


def test_splits_are_disjoint_by_question_text_and_seeded(legs: ReasoningGymEnv) -> None:
    train = legs.tasks("train", 300, seed=0)
    heldout = legs.tasks("heldout", 100, seed=0)
    train_questions = {task.prompt for task in train}
    assert not train_questions & {task.prompt for task in heldout}
    # another seed draws other training items, never a held-out question either
    other_seed = legs.tasks("train", 300, seed=1)
    assert {task.prompt for task in other_seed} != train_questions
    assert not {task.prompt for task in other_seed} & {task.prompt for task in heldout}
    assert [task.task_id for task in legs.tasks("train", 300, seed=0)] == [task.task_id for task in train]
    assert len(train_questions) == 300  # distinct while the space allows
    assert {dict(task.metadata)["split"] for task in heldout} == {"heldout"}


def test_reference_scores_one_and_wrong_or_hostile_output_scores_zero(legs: ReasoningGymEnv) -> None:
    task = legs.tasks("heldout", 1, seed=3)[0]
    right = legs.verify(task, f"  {task.reference_answer}\n")
    assert (right.reward, right.passed, right.reason) == (1.0, True, VerdictReason.OK)
    wrong = str(int(task.reference_answer) + 1)
    assert (legs.verify(task, wrong).reward, legs.verify(task, wrong).reason) == (0.0, VerdictReason.WRONG)
    for hostile in ("", "   ", task.prompt, f"{task.reference_answer} {wrong} 7", "9" * 5000, "\x00\udcff", "nan"):
        verdict = legs.verify(task, hostile)
        assert verdict.reward == 0.0 and not verdict.passed, hostile[:40]
        assert len(verdict.detail) <= 200


def test_partial_credit_only_when_asked() -> None:
    # reasoning-gym's base score_answer gives len(oracle)/len(answer) to any output containing
    # the oracle: for an oracle of n characters, "oracle oracle" has 2n + 1, so n / (2n + 1).
    env = ReasoningGymEnv("rg_gcd", "gcd", {"min_value": 1, "max_value": 50}, partial_credit=True)
    task = env.tasks("train", 1, seed=0)[0]
    n = len(task.reference_answer)
    doubled = f"{task.reference_answer} {task.reference_answer}"
    assert env.verify(task, doubled).reward == pytest.approx(n / (2 * n + 1))
    assert env.verify(task, doubled).reason is VerdictReason.WRONG
    strict = ReasoningGymEnv("rg_gcd", "gcd", {"min_value": 1, "max_value": 50})
    assert strict.verify(task, doubled).reward == 0.0


def test_a_score_answer_that_raises_or_returns_junk_gives_zero_and_a_reason(legs: ReasoningGymEnv, monkeypatch) -> None:
    task = legs.tasks("train", 1, seed=0)[0]

    def raises(answer, entry):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(legs, "score_answer", raises)
    verdict = legs.verify(task, task.reference_answer)
    assert (verdict.reward, verdict.reason) == (0.0, VerdictReason.FORMAT)
    assert "score_answer raised ZeroDivisionError" in verdict.detail
    for junk in (float("nan"), 1.5, -0.1, "1.0", None, True):
        monkeypatch.setattr(legs, "score_answer", lambda answer, entry, junk=junk: junk)
        verdict = legs.verify(task, task.reference_answer)
        assert (verdict.reward, verdict.reason) == (0.0, VerdictReason.FORMAT), junk
        assert "not a number in [0, 1]" in verdict.detail


def test_the_entry_is_regenerated_from_the_payload(legs: ReasoningGymEnv) -> None:
    task = legs.tasks("train", 1, seed=5)[0]
    tampered = json.loads(task.verifier.payload)
    tampered["index"] += 1  # another item: its question no longer matches the digest
    bad_task = type(task)(**{**task.__dict__, "verifier": type(task.verifier)(task.verifier.kind, json.dumps(tampered))})
    with pytest.raises(RuntimeError, match="regenerates another question"):
        legs.verify(bad_task, task.reference_answer)


def test_bad_configs_are_config_errors() -> None:
    tables = {"reasoning_gym": {"rg_x": {"dataset": "leg_countin"}}}
    with pytest.raises(ConfigError, match="did you mean leg_counting"):
        build_env("rg_x", **tables)
    with pytest.raises(ConfigError, match="sets \\['seed'\\]"):
        build_env("rg_x", reasoning_gym={"rg_x": {"dataset": "gcd", "config": {"seed": 3}}})
    with pytest.raises(ConfigError, match="rejects config"):
        build_env("rg_x", reasoning_gym={"rg_x": {"dataset": "gcd", "config": {"no_such_key": 3}}})
    with pytest.raises(ConfigError, match="unknown domain 'rg_y'"):
        build_env("rg_y", **tables)


def test_shipped_config_has_eight_or_more_solvable_datasets(shipped_mixture) -> None:
    # the adapter's solvability check: every reference answer scores 1, a wrong one 0
    envs = shipped_mixture.envs
    assert len({env.dataset for env in envs.values()}) >= 8
    for name, env in envs.items():
        tasks = env.tasks("train", 20, seed=0) + env.tasks("heldout", 20, seed=0)
        for task in tasks:
            assert env.verify(task, task.reference_answer).reward == 1.0, (name, task.prompt)
            wrong = "zzzz" if task.reference_answer.isdigit() is False else str(int(task.reference_answer) + 1)
            assert env.verify(task, wrong).reward == 0.0, (name, task.prompt, wrong)


def test_shipped_mixture_samples_distinct_tasks_of_every_domain(shipped_mixture) -> None:
    tasks = shipped_mixture.sample(100, rng_seed=7)
    assert len({task.task_id for task in tasks}) == 100
    assert {task.domain for task in tasks} == set(shipped_mixture.envs)
    heldout = shipped_mixture.heldout(5)
    assert not {task.prompt for task in tasks} & {task.prompt for task in heldout}


def test_domain_prompt_format_must_match_the_model(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="prompt_format"):
        load_config(CONFIG, ["envs.reasoning_gym.rg_gcd.prompt_format=\"plain\""])
    config = load_config(CONFIG, ["envs.reasoning_gym.rg_gcd.prompt_template=\"Q: {question} A:\""])
    env = build_mixture(config).envs["rg_gcd"]
    assert env.tasks("train", 1, seed=0)[0].prompt.startswith("Q: ")
