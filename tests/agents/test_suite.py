"""The built-in suite on bubblewrap: the oracle passes every task, an agent that does nothing fails every one."""

from __future__ import annotations

import pytest

from rlpipe.agents.evaluation import run_eval
from rlpipe.agents.records import TrialVerdict
from rlpipe.agents.task_format import builtin_suite_dir, load_tasks
from tests.sandbox._bwrap_support import require_bwrap

pytestmark = pytest.mark.bwrap


@pytest.fixture(scope="module")
def suite():
    require_bwrap()
    return load_tasks(builtin_suite_dir())


def test_the_oracle_passes_every_task(suite):
    report = run_eval(suite, "oracle", "bwrap", workers=4)
    failures = {trial.task_id: (trial.verdict.value, trial.detail) for trial in report.trials if not trial.passed}
    assert failures == {}
    assert report.metrics["success_rate"] == 1.0 and report.metrics["passed"] == len(suite) >= 20


def test_an_agent_that_does_nothing_fails_every_task(suite):
    report = run_eval(suite, "noop", "bwrap", workers=4)
    assert {trial.task_id: trial.verdict for trial in report.trials} == {task.task_id: TrialVerdict.FAILED for task in suite}
    assert report.metrics["success_rate"] == 0.0 and report.metrics["scored"] == len(suite)
    assert all(trial.reward == 0.0 and len(trial.steps) == 1 for trial in report.trials)  # one step: submit
