"""The curriculum rule (rl/curriculum.py) on hand-computed numbers, and its wiring: a step's
ratios come from committed manifests alone, so a fresh process recomputes them exactly."""

from types import SimpleNamespace

import pytest

from rlpipe.controller.runtime import RunProgress
from rlpipe.core.config import load_config
from rlpipe.core.errors import ConfigError
from rlpipe.rl.curriculum import (
    Curriculum,
    CurriculumSettings,
    MissingStep,
    domain_rates,
    learnability,
    target_ratios,
    with_floor,
)
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import StepManifest


def test_learnability_is_one_in_the_band_and_falls_linearly_outside():
    assert learnability(0.5, 0.2, 0.8) == 1.0 and learnability(0.2, 0.2, 0.8) == 1.0
    assert learnability(None, 0.2, 0.8) == 1.0  # no pass rate yet: worth trying
    assert learnability(0.1, 0.2, 0.8) == pytest.approx(0.5)  # 0.1 / 0.2
    assert learnability(0.9, 0.2, 0.8) == pytest.approx(0.5)  # (1 - 0.9) / (1 - 0.8)
    assert learnability(0.0, 0.2, 0.8) == 0.0 and learnability(1.0, 0.2, 0.8) == 0.0


def test_target_is_base_times_learnability_or_the_base_when_nothing_is_learnable():
    # a: solved (0), b: in band (1), c: 0.1 -> 0.5; weights 0, 2 x 1, 1 x 0.5 -> 0, 0.8, 0.2
    target = target_ratios({"a": 1.0, "b": 2.0, "c": 1.0}, {"a": 1.0, "b": 0.5, "c": 0.1}, 0.2, 0.8)
    assert target == pytest.approx({"a": 0.0, "b": 0.8, "c": 0.2})
    assert target_ratios({"a": 1.0, "b": 3.0}, {"a": 0.0, "b": 1.0}, 0.2, 0.8) == pytest.approx({"a": 0.25, "b": 0.75})


def test_floor_keeps_every_domain_above_min_ratio_and_the_sum_at_one():
    # (1 - 2 x 0.1) x q + 0.1: 0.8 x 0 + 0.1 = 0.1, 0.8 x 1 + 0.1 = 0.9
    assert with_floor({"a": 0.0, "b": 1.0}, 0.1) == pytest.approx({"a": 0.1, "b": 0.9})
    with pytest.raises(ValueError, match="exceeds 1"):
        with_floor({"a": 0.5, "b": 0.5, "c": 0.0}, 0.4)


RATES = {1: {"a": 1.0, "b": 0.5}, 2: {"a": 0.9, "b": 0.1}, 3: {"a": 0.0}}


def test_ratios_step_by_step_by_hand():
    settings = CurriculumSettings(low=0.2, high=0.8, rate=0.5, min_ratio=0.1, window=2)
    curriculum = Curriculum({"a": 1.0, "b": 1.0}, settings, RATES.get)
    # step 1: nothing committed: q1 = q0 = (0.5, 0.5); floored 0.8 x 0.5 + 0.1 = 0.5
    assert curriculum.ratios(1) == pytest.approx({"a": 0.5, "b": 0.5})
    # step 2: window = step 1: a solved -> 0, b in band -> 1: target (0, 1);
    # q2 = 0.5 (0.5, 0.5) + 0.5 (0, 1) = (0.25, 0.75); floored 0.8 q + 0.1 = (0.3, 0.7)
    assert curriculum.ratios(2) == pytest.approx({"a": 0.3, "b": 0.7})
    # step 3: window = steps 1-2: a (1.0 + 0.9) / 2 = 0.95 -> (1 - 0.95) / 0.2 = 0.25; b 0.3 -> 1;
    # target (0.5 x 0.25, 0.5 x 1) / 0.625 = (0.2, 0.8); q3 = 0.5 (0.25, 0.75) + 0.5 (0.2, 0.8)
    # = (0.225, 0.775); floored (0.28, 0.72)
    assert curriculum.ratios(3) == pytest.approx({"a": 0.28, "b": 0.72})
    # step 4: window = steps 2-3: a (0.9 + 0.0) / 2 = 0.45 -> 1; b only at step 2: 0.1 -> 0.5;
    # target (0.5, 0.25) / 0.75 = (2/3, 1/3); q4 = 0.5 (0.225, 0.775) + 0.5 (2/3, 1/3)
    # = (0.44583, 0.55417); floored (0.45667, 0.54333)
    assert curriculum.ratios(4) == pytest.approx({"a": 0.1 + 0.8 * (0.1125 + 1 / 3), "b": 0.1 + 0.8 * (0.3875 + 1 / 6)})


def test_a_fresh_curriculum_recomputes_the_same_ratios_as_one_that_went_step_by_step():
    settings = CurriculumSettings(low=0.2, high=0.8, rate=0.3, min_ratio=0.05, window=3)
    walked = Curriculum({"a": 1.0, "b": 2.0}, settings, RATES.get)
    for step in range(1, 5):
        walked.ratios(step)
    assert Curriculum({"a": 1.0, "b": 2.0}, settings, RATES.get).ratios(4) == walked.ratios(4)  # exactly, not approx


def test_delay_uses_only_steps_at_least_delay_behind():
    asked = []

    def rates(step):
        asked.append(step)
        return RATES.get(step)

    settings = CurriculumSettings(low=0.2, high=0.8, rate=0.5, min_ratio=0.1, window=2, delay=1)
    curriculum = Curriculum({"a": 1.0, "b": 1.0}, settings, rates)
    # step 2 may be drawn while step 1 runs: base ratios still; step 3 sees step 1 only
    assert curriculum.ratios(2) == pytest.approx({"a": 0.5, "b": 0.5}) and asked == []
    assert curriculum.ratios(3) == pytest.approx({"a": 0.3, "b": 0.7}) and asked == [1]  # as step 2 without delay


def test_a_step_that_is_not_committed_is_an_error_not_a_guess():
    curriculum = Curriculum({"a": 1.0, "b": 1.0}, CurriculumSettings(window=2), RATES.get)
    with pytest.raises(MissingStep, match="step 4"):
        curriculum.ratios(6)  # needs steps 4-5


def test_domains_of_ratio_zero_stay_at_zero_and_take_no_floor():
    curriculum = Curriculum({"a": 1.0, "b": 1.0, "off": 0.0}, CurriculumSettings(min_ratio=0.1, window=1), RATES.get)
    assert curriculum.ratios(2)["off"] == 0.0 and sum(curriculum.ratios(2).values()) == pytest.approx(1.0)


def test_domain_rates_are_the_per_domain_rewards_of_a_manifest():
    assert domain_rates({"reward/mean": 0.5, "reward/a": 1.0, "reward/b": 0.0, "rollout/tokens": 9.0}) == {"a": 1.0, "b": 0.0}


def test_config_refuses_a_floor_the_domains_cannot_meet_and_a_bad_band():
    domains = ["envs.domains={arithmetic = 1.0, reverse = 1.0, code = 1.0}", "curriculum.enabled=true"]
    with pytest.raises(ConfigError, match="min_ratio"):
        load_config(None, [*domains, "curriculum.min_ratio=0.4"])
    with pytest.raises(ConfigError, match="band"):
        load_config(None, [*domains, "curriculum.band=[0.8, 0.2]"])


def test_the_config_hash_of_a_run_without_curriculum_is_unchanged_by_the_table():
    off = load_config(None)
    assert load_config(None, ["curriculum.rate=0.9"]).config_hash() == off.config_hash()
    assert load_config(None, ["curriculum.enabled=true"]).config_hash() != off.config_hash()


def _commit(lake: Lake, run_id: str, step: int, rates: dict[str, float]) -> None:
    metrics = tuple(sorted({"reward/mean": 0.5, **{f"reward/{name}": value for name, value in rates.items()}}.items()))
    lake.commit_step(StepManifest(run_id=run_id, step=step, policy_version=step - 1, parts=(), rows=0,
                                  metrics=metrics, committed_at_ms=step))


def _runtime(lake: Lake, config):
    from rlpipe.controller.sample import build_mixture

    return SimpleNamespace(run_id="r", config=config, records=SimpleNamespace(lake=lake), mixture=build_mixture(config),
                           progress=RunProgress())


def test_step_tasks_draw_with_ratios_from_the_lake_the_same_in_a_fresh_process(tmp_path):
    from rlpipe.controller.sample import step_ratios, step_tasks

    config = load_config(None, ["envs.domains={arithmetic = 1.0, reverse = 1.0}", "curriculum.enabled=true",
                                "curriculum.rate=1.0", "curriculum.min_ratio=0.0", "curriculum.window=1",
                                "rollout.prompts_per_step=20"])
    lake = Lake.open(str(tmp_path / "lake"))
    live = _runtime(lake, config)
    assert {task.domain for task in step_tasks(live, 1)} == {"arithmetic", "reverse"}  # nothing committed: base
    _commit(lake, "r", 1, {"arithmetic": 1.0, "reverse": 0.5})  # arithmetic solved
    # rate 1, no floor: step 2 draws from the target alone: reverse
    assert step_ratios(live, 2) == {"arithmetic": 0.0, "reverse": 1.0}
    assert {task.domain for task in step_tasks(live, 2)} == {"reverse"}
    resumed = _runtime(lake, config)  # a new process after a kill: only the lake
    assert [t.task_id for t in step_tasks(resumed, 2)] == [t.task_id for t in step_tasks(live, 2)]
    with pytest.raises(RuntimeError, match="needs committed step 2"):
        step_tasks(resumed, 3)
