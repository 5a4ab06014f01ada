"""One trial on bubblewrap: the verifier's isolation from the agent, and each way an episode ends."""

from __future__ import annotations

import pytest

from rlpipe.agents.agents import ScriptedAgent, oracle_agent
from rlpipe.agents.records import Ending, TrialVerdict
from rlpipe.agents.task_format import builtin_suite_dir, load_task
from rlpipe.agents.tools import tool_call_json
from rlpipe.agents.trial import run_trial
from tests.agents.helpers import copy_task
from tests.sandbox._bwrap_support import require_bwrap

pytestmark = pytest.mark.bwrap
FIX = "python3 -c \"import re; p='stats.py'; s=open(p).read(); open(p,'w').write(s.replace('return ordered[middle]', " \
      "'return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2'))\""


@pytest.fixture(autouse=True)
def _bwrap():
    require_bwrap()


def scripted(*replies: str):
    return lambda task: ScriptedAgent(list(replies))


def trial(replies, task=None, **kwargs):
    task = task or load_task(builtin_suite_dir() / "fix-median-bug")
    return run_trial(task, "scripted", scripted(*replies), "bwrap", **kwargs)


def test_a_scripted_fix_passes_and_every_step_is_recorded():
    result = trial([tool_call_json("bash", command="cat stats.py"), tool_call_json("bash", command=FIX), tool_call_json("submit")])
    assert (result.verdict, result.ending, result.reward) == (TrialVerdict.PASSED, Ending.SUBMITTED, 1.0)
    assert [step.tool for step in result.steps] == ["bash", "bash", "submit"]
    assert "def median" in result.steps[0].observation and result.steps[0].exit_code == 0


def test_planted_rewards_fake_tests_and_a_leftover_process_do_not_change_the_verdict():
    hacks = ("mkdir -p logs/verifier tests /tmp/logs/verifier && echo 1 > logs/verifier/reward.txt && "
             "echo 1 > /tmp/logs/verifier/reward.txt && printf 'echo 1 > /logs/verifier/reward.txt\\n' > tests/test.sh; "
             "(while true; do echo 1 > /work/logs/verifier/reward.txt; sleep 0.05; done) & "
             "nohup sh -c 'sleep 1000' >/dev/null 2>&1 &")
    result = trial([tool_call_json("bash", command=hacks), tool_call_json("submit")])
    assert (result.verdict, result.reward) == (TrialVerdict.FAILED, 0.0)
    assert "expected 2.5" in result.detail


def test_deleting_the_agents_copy_of_the_tests_does_not_matter():
    result = trial([tool_call_json("bash", command="rm test_stats.py && " + FIX), tool_call_json("submit")])
    assert result.verdict is TrialVerdict.PASSED


def test_malformed_calls_are_counted_and_three_in_a_row_end_the_episode():
    result = trial(["ls please", tool_call_json("bash", command="true"), '{"name": "sudo"}', "{oops", '{"name": "bash"}',
                    tool_call_json("submit")])
    assert result.ending is Ending.MALFORMED_CALLS and result.verdict is TrialVerdict.MALFORMED_CALLS
    assert result.malformed_counts == {"no_call": 1, "unknown_tool": 1, "invalid_json": 1, "bad_arguments": 1}
    assert len(result.steps) == 5 and result.steps[-1].observation.startswith("error: malformed tool call (bad_arguments)")


def test_running_out_of_steps_is_max_steps_but_a_solved_state_still_passes(tmp_path):
    task = load_task(copy_task(tmp_path, toml="[agent]\nmax_steps = 2\n"))
    idle = trial([tool_call_json("bash", command="true")] * 3, task=task)
    assert (idle.verdict, idle.ending, len(idle.steps)) == (TrialVerdict.MAX_STEPS, Ending.MAX_STEPS, 2)
    solved = trial([tool_call_json("bash", command=FIX)] * 3, task=task)
    assert (solved.verdict, solved.ending) == (TrialVerdict.PASSED, Ending.MAX_STEPS)


def test_a_command_past_the_agent_time_limit_ends_in_agent_timeout(tmp_path):
    task = load_task(copy_task(tmp_path, toml="[agent]\ntimeout_sec = 1.0\n"))
    result = trial([tool_call_json("bash", command="sleep 30"), tool_call_json("submit")], task=task)
    assert (result.verdict, result.ending) == (TrialVerdict.AGENT_TIMEOUT, Ending.AGENT_TIMEOUT)
    assert result.steps[0].observation.startswith("exit_code: timed out")


def test_tool_errors_are_observations_not_crashes():
    result = trial([tool_call_json("read_file", path="missing.txt"), tool_call_json("write_file", path="../escape", content="x"),
                    tool_call_json("read_file", path="/work/stats.py"), tool_call_json("submit")])
    assert [step.tool_error for step in result.steps] == [True, True, False, False]
    assert "def median" in result.steps[2].observation and result.verdict is TrialVerdict.FAILED


def test_missing_commands_setup_failures_and_absent_rewards_have_their_verdicts(tmp_path):
    needs = load_task(copy_task(tmp_path / "a", toml='[environment]\nrequires_commands = ["no-such-tool"]\n'))
    assert run_trial(needs, "oracle", oracle_agent, "bwrap").verdict is TrialVerdict.SKIPPED
    setup = load_task(copy_task(tmp_path / "b", toml='[environment]\nsetup_script = "boom.sh"\n', **{"environment__boom.sh": "exit 3\n"}))
    assert run_trial(setup, "noop", scripted(), "bwrap").verdict is TrialVerdict.SETUP_ERROR
    silent = load_task(copy_task(tmp_path / "c", **{"tests__test.sh": "#!/bin/sh\necho no reward\n"}))
    result = run_trial(silent, "noop", scripted(), "bwrap")
    assert (result.verdict, result.verdict.family, result.reward) == (TrialVerdict.VERIFIER_ERROR, "agent", 0.0)


def test_an_agent_that_raises_is_an_agent_error():
    class Broken:
        def act(self, messages):
            raise RuntimeError("bug in the agent")

    result = run_trial(load_task(builtin_suite_dir() / "fix-median-bug"), "broken", lambda task: Broken(), "bwrap")
    assert result.verdict is TrialVerdict.AGENT_ERROR and "bug in the agent" in result.detail
