"""Mixture.sample with a step's explicit ratios (the curriculum's), over the mixture's domains."""

import pytest

from rlpipe.core.errors import ConfigError
from rlpipe.envs.mixture import Mixture, build_env


def mixture() -> Mixture:
    return Mixture({"arithmetic": build_env("arithmetic"), "reverse": build_env("reverse")}, {"arithmetic": 1.0, "reverse": 1.0})


def test_explicit_ratios_replace_the_mixtures_for_one_draw():
    mix = mixture()
    assert {task.domain for task in mix.sample(30, rng_seed=1, ratios={"arithmetic": 0.0, "reverse": 2.0})} == {"reverse"}
    assert {task.domain for task in mix.sample(30, rng_seed=1)} == {"arithmetic", "reverse"}  # the mixture's own, unchanged


def test_ratios_equal_to_the_mixtures_draw_the_same_tasks():
    mix = mixture()
    same = mix.sample(20, rng_seed=3, ratios={"arithmetic": 5.0, "reverse": 5.0})  # normalised: 0.5, 0.5
    assert [t.task_id for t in same] == [t.task_id for t in mix.sample(20, rng_seed=3)]


def test_ratios_naming_an_unbuilt_domain_are_refused():
    with pytest.raises(ConfigError, match="not built"):
        mixture().sample(4, rng_seed=0, ratios={"code": 1.0})
