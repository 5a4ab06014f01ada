"""Trials on docker: the oracle passes and doing nothing fails; the image has the shell tools tasks use.

A trial that ends in SANDBOX_ERROR fails these tests: the docker backend is what they check.
They skip only where no docker engine answers and none was provisioned
(tests/helpers/docker_engine.py: `make test`, so CI, provisions one and fails instead).
"""

from __future__ import annotations

import pytest

from rlpipe.agents.agents import noop_agent, oracle_agent
from rlpipe.agents.records import TrialVerdict
from rlpipe.agents.task_format import builtin_suite_dir, load_task
from rlpipe.agents.trial import run_trial
from tests.agents.helpers import copy_task
from tests.helpers.docker_engine import require_docker_engine

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def _docker_engine() -> None:
    require_docker_engine()


def test_the_oracle_passes_and_noop_fails_a_task_in_docker():
    task = load_task(builtin_suite_dir() / "fix-median-bug")
    oracle = run_trial(task, "oracle", oracle_agent, "docker")
    assert (oracle.verdict, oracle.reward) == (TrialVerdict.PASSED, 1.0), oracle.detail
    noop = run_trial(task, "noop", noop_agent, "docker")
    assert noop.verdict is TrialVerdict.FAILED, noop.detail


@pytest.mark.parametrize("name", ["git-find-author", "build-c-program", "jsonl-to-csv"])
def test_tasks_needing_git_gcc_make_and_jq_pass_in_docker(name):
    result = run_trial(load_task(builtin_suite_dir() / name), "oracle", oracle_agent, "docker")
    assert (result.verdict, result.reward) == (TrialVerdict.PASSED, 1.0), result.detail


def test_a_task_needing_a_command_the_image_lacks_is_skipped_in_docker(tmp_path):
    task = load_task(copy_task(tmp_path, toml='[environment]\nrequires_commands = ["no-such-tool"]\n'))
    result = run_trial(task, "oracle", oracle_agent, "docker")
    assert result.verdict is TrialVerdict.SKIPPED, result.detail
    assert "no-such-tool" in result.detail and "docker sandbox lacks" in result.detail
