"""Replay from a step of a recorded trial (re-execution with /work digests), with scripted agents on bubblewrap."""

from __future__ import annotations

import json

import pytest

from rlpipe.agents.agents import ScriptedAgent, noop_agent
from rlpipe.agents.evaluation import run_eval, start_eval
from rlpipe.agents.records import TrialVerdict
from rlpipe.agents.replay import load_replay
from rlpipe.agents.task_format import load_tasks
from rlpipe.agents.tools import tool_call_json
from rlpipe.agents.tree_state import ReplayDiverged
from rlpipe.agents.trial import TrialOptions
from rlpipe.core.errors import ConfigError
from rlpipe.storage.evals import EvalStore
from rlpipe.storage.lake import Lake
from rlpipe.storage.query import query_trajectories
from tests.agents.helpers import copy_task
from tests.agents.test_trial import FIX
from tests.cli.cli_process import error_lines, run_rlpipe
from tests.sandbox._bwrap_support import require_bwrap

pytestmark = pytest.mark.bwrap
STAMP = "date +%s%N > stamp.txt"  # a different /work each time it runs


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A lake with one committed trial of fix-median-bug: cat, the fix, a stamp of the clock, submit
    (shared by the tests of this module: each replay is an eval of its own id)."""
    require_bwrap()
    tmp_path = tmp_path_factory.mktemp("replay")
    tasks_dir = tmp_path / "tasks"
    copy_task(tasks_dir)
    tasks = load_tasks(tasks_dir)
    store = EvalStore(Lake.open(str(tmp_path / "lake")))
    replies = [tool_call_json("bash", command="cat stats.py"), "not a call", tool_call_json("bash", command=FIX),
               tool_call_json("bash", command=STAMP), tool_call_json("submit")]
    recorder = start_eval(store, "source", "scripted", "bwrap", tasks_dir, tasks, TrialOptions(), max_attempts=1)
    report = run_eval(tasks, "scripted", "bwrap", recorder=recorder, factory=lambda task: ScriptedAgent(replies))
    assert report.trials[0].verdict is TrialVerdict.PASSED
    return store, tasks_dir


def replay(store: EvalStore, tasks_dir, from_step: int, eval_id: str, agent=noop_agent):
    source = load_replay(store, "source/fix-median-bug/1", from_step)
    recorder = start_eval(store, eval_id, "noop", "bwrap", tasks_dir, [source.task], TrialOptions(), 1,
                          replay_of="source/fix-median-bug/1", replay_from_step=from_step)
    return run_eval([source.task], "noop", "bwrap", recorder=recorder, factory=agent, replay=source.prefix).trials[0]


def test_the_state_after_step_k_is_restored_and_another_agent_goes_on(recorded):
    store, tasks_dir = recorded
    # after step 2 (cat, a malformed reply) the fix is not applied: noop submits -> failed
    before_fix = replay(store, tasks_dir, 2, "replay-2")
    assert before_fix.verdict is TrialVerdict.FAILED
    assert [(s.tool, s.malformed_kind) for s in before_fix.steps] == [("bash", None), (None, "no_call"), ("submit", None)]
    assert before_fix.malformed_counts == {"no_call": 1}
    # after step 3 (the fix) noop's submit passes: the fix was re-executed
    after_fix = replay(store, tasks_dir, 3, "replay-3")
    assert after_fix.verdict is TrialVerdict.PASSED and [s.tool for s in after_fix.steps] == ["bash", None, "bash", "submit"]
    rows = query_trajectories(store.lake, "select eval_id, replay_of, replay_from_step, steps, verdict from eval_trials "
                                          "where eval_id in ('replay-2', 'replay-3') order by eval_id").rows
    assert rows == [("replay-2", "source/fix-median-bug/1", 2, 3, "failed"), ("replay-3", "source/fix-median-bug/1", 3, 4, "passed")]
    # the fix's step: its digest in the replay equals the source's
    digests = query_trajectories(store.lake, "select eval_id, tree_sha256 from eval_steps where step = 2 and tool = 'bash' "
                                             "and eval_id in ('source', 'replay-3') order by eval_id").rows
    assert [eval_id for eval_id, _ in digests] == ["replay-3", "source"]
    assert digests[0][1] == digests[1][1] and len(digests[0][1]) == 64


def test_the_new_agent_sees_the_conversation_up_to_step_k(recorded):
    store, tasks_dir = recorded
    seen = []

    class Watching(ScriptedAgent):
        def act(self, messages):
            seen.append([(m.role, m.content[:40]) for m in messages])
            return super().act(messages)

    replay(store, tasks_dir, 1, "replay-watch", agent=lambda task: Watching([]))
    roles = [role for role, _ in seen[0]]
    assert roles == ["system", "user", "assistant", "tool"] and seen[0][2][1] == json.dumps(
        {"name": "bash", "arguments": {"command": "cat stats.py"}})[:40]
    assert seen[0][3][1].startswith("exit_code: 0")


def test_a_step_that_does_not_reproduce_its_tree_is_refused(recorded):
    store, tasks_dir = recorded
    with pytest.raises(ReplayDiverged, match="re-executing step 4 of trial source/fix-median-bug/1 .*not deterministic"):
        replay(store, tasks_dir, 4, "replay-4")


@pytest.mark.parametrize(("trial", "step", "error"), [
    ("source/fix-median-bug/1", 5, "step 5 of trial source/fix-median-bug/1 is its submit"),
    ("source/fix-median-bug/1", 6, "--from-step 6 is outside trial source/fix-median-bug/1, which has 5 steps"),
    ("source/fix-median-bug/2", 1, "eval 'source' has no committed trial"),
    ("source/fix-median-bug", 1, "is not EVAL_ID/TASK/ATTEMPT"),
])
def test_bad_replay_requests_are_refused(recorded, trial, step, error):
    store, _ = recorded
    with pytest.raises(ConfigError.__mro__[1], match=error):  # UserError: ConfigError or RunNotFoundError
        load_replay(store, trial, step)


def test_the_replay_command_records_a_linked_trial_and_refuses_a_diverging_step(recorded, tmp_path):
    store, _ = recorded
    lake = store.uri
    ran = run_rlpipe(["eval", "replay", "source/fix-median-bug/1", "--from-step", "3", "--agent", "noop", "--lake", lake,
                      "--eval-id", "cli-replay", "--json"], cwd=tmp_path, timeout_s=120)
    assert ran.returncode == 0, ran.stderr
    output = json.loads(ran.stdout)
    assert (output["verdict"], output["trial_id"], output["replay_of"], output["steps"]) == (
        "passed", "cli-replay/fix-median-bug/1", "source/fix-median-bug/1", 4)
    diverged = run_rlpipe(["eval", "replay", "source/fix-median-bug/1", "--from-step", "4", "--agent", "noop", "--lake", lake],
                          cwd=tmp_path, timeout_s=120)
    assert diverged.returncode == 2 and "not deterministic" in error_lines(diverged)[0]
