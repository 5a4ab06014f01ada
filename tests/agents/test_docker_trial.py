"""One trial on docker: the oracle's fix passes and doing nothing fails, on a task that needs only sh and python3."""

from __future__ import annotations

import pytest

from rlpipe.agents.agents import noop_agent, oracle_agent
from rlpipe.agents.records import TrialVerdict
from rlpipe.agents.task_format import builtin_suite_dir, load_task
from rlpipe.agents.trial import run_trial

pytestmark = pytest.mark.docker


def test_the_oracle_passes_and_noop_fails_a_task_in_docker():
    task = load_task(builtin_suite_dir() / "fix-median-bug")
    oracle = run_trial(task, "oracle", oracle_agent, "docker")
    if oracle.verdict is TrialVerdict.SANDBOX_ERROR:
        pytest.skip(f"no docker engine: {oracle.detail}")
    assert (oracle.verdict, oracle.reward) == (TrialVerdict.PASSED, 1.0)
    assert run_trial(task, "noop", noop_agent, "docker").verdict is TrialVerdict.FAILED


def test_a_task_needing_tools_the_image_lacks_is_skipped_in_docker():
    task = load_task(builtin_suite_dir() / "git-find-author")
    result = run_trial(task, "oracle", oracle_agent, "docker")
    if result.verdict is TrialVerdict.SANDBOX_ERROR:
        pytest.skip(f"no docker engine: {result.detail}")
    assert result.verdict is TrialVerdict.SKIPPED and "git" in result.detail and "docker sandbox lacks" in result.detail
