"""Trials committed to the lake and queried back; an injected sandbox death is infrastructure, retried.

The dying sandboxes come from a fake TrialBackend (our protocol): it hands out real bubblewrap
sandboxes, the first `deaths` of which die (close, then SandboxUnavailable) on the agent's
first shell command, as a sandbox whose process was killed does.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from rlpipe.agents.backends import NamedBackend
from rlpipe.agents.evaluation import resume_eval, run_eval, start_eval
from rlpipe.agents.records import TrialVerdict
from rlpipe.agents.recording import EvalRecorder
from rlpipe.agents.task_format import load_tasks
from rlpipe.agents.trial import TrialOptions
from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox.base import ExecResult, Limits, Sandbox, Snapshot, Workspace
from rlpipe.storage.evals import EvalStore
from rlpipe.storage.lake import Lake
from rlpipe.storage.query import query_trajectories
from tests.agents.helpers import copy_task
from tests.sandbox._bwrap_support import require_bwrap

pytestmark = pytest.mark.bwrap


class DyingSandbox:
    """A real sandbox that dies on its first `sh -c` / `bash -c` (the agent's first bash call)."""

    def __init__(self, inner: Sandbox) -> None:
        self.inner = inner

    def exec(self, argv: list[str], stdin: bytes = b"", timeout_s: float | None = None) -> ExecResult:
        if argv[:1] in (["sh"], ["bash"]) and argv[1:2] == ["-c"]:
            self.inner.close()
            raise SandboxUnavailable("the sandbox's process died (killed by the test)", hint="retry the trial")
        return self.inner.exec(argv, stdin, timeout_s)

    def exec_python(self, code: str, stdin: bytes = b"", timeout_s: float | None = None, args: Sequence[str] = ()) -> ExecResult:
        return self.inner.exec_python(code, stdin, timeout_s, args)

    def write_files(self, files: dict[str, bytes]) -> None:
        self.inner.write_files(files)

    def read_file(self, path: str) -> bytes:
        return self.inner.read_file(path)

    def snapshot(self) -> Snapshot:
        return self.inner.snapshot()

    def restore(self, snapshot: Snapshot) -> None:
        self.inner.restore(snapshot)

    def reset(self) -> None:
        self.inner.reset()

    def close(self) -> None:
        self.inner.close()


class FlakyBwrap(NamedBackend):
    """bwrap whose first `deaths` agent sandboxes die mid-trial."""

    def __init__(self, deaths: int) -> None:
        super().__init__("bwrap")
        object.__setattr__(self, "deaths_left", deaths)

    def open(self, limits: Limits, cpus: float, workspace: Workspace = Workspace()) -> Sandbox:
        sandbox = super().open(limits, cpus, workspace)
        if self.deaths_left > 0:
            object.__setattr__(self, "deaths_left", self.deaths_left - 1)
            return DyingSandbox(sandbox)
        return sandbox


@pytest.fixture
def setup(tmp_path):
    require_bwrap()
    tasks_dir = tmp_path / "tasks"
    copy_task(tasks_dir)
    tasks = load_tasks(tasks_dir)
    store = EvalStore(Lake.open(str(tmp_path / "lake")))
    return tasks_dir, tasks, store


def rows(store: EvalStore, sql: str) -> list[tuple]:
    return query_trajectories(store.lake, sql).rows


def test_a_sandbox_death_is_infrastructure_retried_from_the_initial_state_and_recorded(setup):
    tasks_dir, tasks, store = setup
    recorder = start_eval(store, "e1", "oracle", "bwrap", tasks_dir, tasks, TrialOptions(), max_attempts=3)
    report = run_eval(tasks, "oracle", FlakyBwrap(deaths=1), max_attempts=3, recorder=recorder)
    history = report.attempts["fix-median-bug"]
    assert [attempt.trial.verdict for attempt in history] == [TrialVerdict.SANDBOX_ERROR, TrialVerdict.PASSED]
    assert "process died" in history[0].trial.detail
    # the final attempt counts: 1 of 1 scored passed, one retry, no failure of either family
    metrics = report.metrics
    assert (metrics["success_rate"], metrics["attempts"], metrics["infrastructure_retries"]) == (1.0, 2, 1)
    assert metrics["failure_modes"] == {"agent": {}, "infrastructure": {}}
    assert rows(store, "select attempt, verdict, family, final from eval_trials order by attempt") == [
        (1, "sandbox_error", "infrastructure", False), (2, "passed", "agent", True)]
    # the retry started again from the initial files: the oracle's bash call ran in attempt 2 only
    assert rows(store, "select attempt, step, tool, exit_code from eval_steps order by attempt, step") == [
        (2, 0, "bash", 0), (2, 1, "submit", None)]


def test_a_sandbox_that_always_dies_is_never_the_agents_failure_and_resume_retries_it(setup):
    tasks_dir, tasks, store = setup
    recorder = start_eval(store, "e2", "oracle", "bwrap", tasks_dir, tasks, TrialOptions(), max_attempts=2)
    report = run_eval(tasks, "oracle", FlakyBwrap(deaths=5), max_attempts=2, recorder=recorder)
    metrics = report.metrics
    # 2 attempts, both died: nothing scored, one infrastructure failure, no agent failure
    assert (metrics["scored"], metrics["success_rate"], metrics["infrastructure_failures"], metrics["attempts"]) == (0, 0.0, 1, 2)
    assert metrics["failure_modes"] == {"agent": {}, "infrastructure": {"sandbox_error": 1}}
    resumed, loaded, options = resume_eval(store, "e2")
    assert resumed.session == 1 and [task.task_id for task in loaded] == ["fix-median-bug"]
    again = run_eval(loaded, "oracle", "bwrap", options=options, max_attempts=2, recorder=resumed)
    assert [(a.attempt, a.session, a.trial.verdict.value) for a in again.attempts["fix-median-bug"]] == [
        (1, 0, "sandbox_error"), (2, 0, "sandbox_error"), (3, 1, "passed")]
    # a third session finds the task finished and runs nothing
    third, loaded, options = resume_eval(store, "e2")
    done = run_eval(loaded, "oracle", FlakyBwrap(deaths=5), options=options, recorder=third)
    assert done.metrics["success_rate"] == 1.0 and len(done.attempts["fix-median-bug"]) == 3


def test_a_recorded_trial_reads_back_equal_to_the_live_one(setup):
    tasks_dir, tasks, store = setup
    recorder = start_eval(store, "e3", "noop", "bwrap", tasks_dir, tasks, TrialOptions(), max_attempts=1)
    live = run_eval(tasks, "noop", "bwrap", recorder=recorder).trials[0]
    stored = EvalRecorder(store, recorder.info, session=1).attempts()["fix-median-bug"][0].trial
    assert stored == live and stored.verdict is TrialVerdict.FAILED
    assert rows(store, "select eval_id, agent, tasks from evals") == [("e3", "noop", 1)]
