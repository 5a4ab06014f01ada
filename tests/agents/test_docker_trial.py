"""Trials on docker: the oracle passes and doing nothing fails; the image has the shell tools tasks use;
an eval's trial runs in a container labelled with the eval's id (issue 31, item 6).

A trial that ends in SANDBOX_ERROR fails these tests: the docker backend is what they check.
They skip only where no docker engine answers and none was provisioned
(tests/helpers/docker_engine.py: `make test`, so CI, provisions one and fails instead).
"""

from __future__ import annotations

import uuid

import pytest

from rlpipe.agents.agents import ScriptedAgent, noop_agent, oracle_agent
from rlpipe.agents.evaluation import resume_eval, run_eval, start_eval
from rlpipe.agents.records import TrialVerdict
from rlpipe.agents.task_format import builtin_suite_dir, load_task, load_tasks
from rlpipe.agents.tools import tool_call_json
from rlpipe.agents.trial import TrialOptions, run_trial
from rlpipe.storage.evals import EvalStore
from rlpipe.storage.lake import Lake
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


class LabelWatcher:
    """An agent factory whose agent, on its first turn (the trial's container runs then), lists
    the running sandbox containers labelled with `run_id`; then it submits."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.seen: list[list[str]] = []

    def __call__(self, task) -> ScriptedAgent:
        watcher = self

        class Watching(ScriptedAgent):
            def act(self, messages):
                from rlpipe.sandbox.docker_backend import docker_client

                found = docker_client().api.containers(filters={"label": ["rlpipe.sandbox=1", f"rlpipe.run_id={watcher.run_id}"]})
                watcher.seen.append([c["Id"] for c in found])
                return tool_call_json("submit")

        return Watching([])

    def labelled_now(self) -> list[str]:
        from rlpipe.sandbox.docker_backend import docker_client

        return [c["Id"] for c in docker_client().api.containers(all=True, filters={"label": f"rlpipe.run_id={self.run_id}"})]


def _open_eval(tmp_path, eval_id: str) -> tuple[Lake, list]:
    tasks_dir = tmp_path / "tasks"
    copy_task(tasks_dir)
    tasks = load_tasks(tasks_dir)
    lake = Lake.open(str(tmp_path / "lake"))
    start_eval(EvalStore(lake), eval_id, "noop", "docker", tasks_dir, tasks, TrialOptions(), max_attempts=1)
    return lake, tasks


def test_an_evals_trial_container_carries_the_eval_id_while_it_runs(tmp_path):
    """`rlpipe eval`'s path: the flow's open-eval and trial tasks (their functions, no Prefect server)."""
    from rlpipe.tasks.eval_trials import open_eval, trial

    eval_id = f"label-{uuid.uuid4().hex[:8]}"
    lake, tasks = _open_eval(tmp_path, eval_id)
    watcher = LabelWatcher(eval_id)
    runtime = open_eval.fn(eval_id, lake.uri)
    try:
        assert runtime.pending() == [tasks[0].task_id]
        runtime.factory = watcher
        assert trial.fn(runtime, tasks[0].task_id) == TrialVerdict.FAILED.value  # submitted without solving
    finally:
        runtime.close()
    assert [len(ids) for ids in watcher.seen] == [1]  # the agent's container, labelled, while the trial ran
    assert watcher.labelled_now() == []  # removed when the trial ended


def test_an_in_process_evals_trial_container_carries_the_eval_id(tmp_path):
    """run_eval with a recorder (the path of `rlpipe eval --replay`)."""
    eval_id = f"label-{uuid.uuid4().hex[:8]}"
    lake, tasks = _open_eval(tmp_path, eval_id)
    recorder, _, _ = resume_eval(EvalStore(lake), eval_id)
    watcher = LabelWatcher(eval_id)
    report = run_eval(tasks, "noop", "docker", workers=1, recorder=recorder, factory=watcher, max_attempts=1)
    assert report.trials[0].verdict is TrialVerdict.FAILED, report.trials[0].detail
    assert [len(ids) for ids in watcher.seen] == [1]
    assert watcher.labelled_now() == []
