"""warmstart.target_scope: the figure a warm-start accuracy check compares with the target
(the overall accuracy, or the least-learned domain's), and the config hash of runs that
leave it at its default."""

import pytest

from rlpipe.core.config import load_config
from rlpipe.core.errors import ConfigError
from rlpipe.controller.evaluation import warmstart_accuracy

RESULT = {"accuracy": 0.4, "accuracy/arithmetic": 0.1, "accuracy/reverse": 0.7}


def test_overall_scope_compares_the_overall_accuracy():
    assert warmstart_accuracy(RESULT, "overall") == 0.4


def test_every_domain_scope_compares_the_least_learned_domain():
    assert warmstart_accuracy(RESULT, "every_domain") == 0.1
    assert warmstart_accuracy({**RESULT, "accuracy/arithmetic": 0.9}, "every_domain") == 0.7


def test_an_unknown_scope_is_refused():
    with pytest.raises(ValueError, match="target_scope"):
        warmstart_accuracy(RESULT, "mean")
    with pytest.raises(ConfigError, match="target_scope"):
        load_config(None, ['warmstart.target_scope="mean"'])


def test_the_config_hash_of_a_run_with_the_overall_scope_is_unchanged_by_the_key():
    default = load_config(None)
    assert load_config(None, ['warmstart.target_scope="overall"']).config_hash() == default.config_hash()
    assert load_config(None, ['warmstart.target_scope="every_domain"']).config_hash() != default.config_hash()
