"""A hostile agent against the verifier, on bubblewrap and on docker: each hack scores 0.

The agent solves nothing (fix-median-bug stays broken) and tries to change how the
verifier runs or what it reads (agents/verifier.py states the trust model). The hacks are
the quality gate's own list (rlpipe/qa/agent_probes.py: a user site or .pth file under its
HOME, modules in /work named like the ones trusted steps import, modules that exit 0 at
import or at exit, return values equal to everything, kill the verifier step, planted
reward files and fake tests, a background forger, a reward the checked code writes and
locks, a folder in place of reward.txt; a full disk, sparse files, a work dir it locks, a
tree too deep or with paths too long to copy), plus three aimed at this task's stats.py, and
replies no process can take (a NUL in a command). Each trial must be recorded with reward 0
and an agent verdict, never pass and never turn into infrastructure.

Where each backend plays the gate's own list: bubblewrap here, one test per probe (a trial
costs ~0.3 CPU s); docker in tests/agents/test_eval_hostile_cli.py, every probe through
`rlpipe eval --backend docker` with the same assertions per trial (reward 0, no pass, no
infrastructure failure), since a docker trial costs ~3 CPU s of the engine's and the same
list played twice more on docker was ~40% of the suite's docker time. Everything else in
this file (the task-specific hacks, all hacks at once, the forger, the oracle behind junk,
unusable commands and paths) runs on both.
"""

from __future__ import annotations

import pytest

from rlpipe.agents.agents import ScriptedAgent, oracle_agent
from rlpipe.agents.records import TrialVerdict
from rlpipe.agents.task_format import builtin_suite_dir, load_task
from rlpipe.agents.tools import tool_call_json
from rlpipe.agents.trial import run_trial
from rlpipe.agents.verifier import read_reward
from rlpipe.qa.agent_probes import BROKEN_STATES, SHADOWED, TRUST_HACKS, USER_SITE
from tests.helpers.docker_engine import require_docker_engine
from tests.sandbox._bwrap_support import require_bwrap

# task-specific: fix-median-bug's stats.py, imported by its check
EXIT_AT_IMPORT = "printf 'import os; os._exit(0)\\n' > /work/stats.py"
EXIT_AT_EXIT = ("printf 'import atexit, os\\natexit.register(lambda: os._exit(0))\\n"
                "def median(v): return 0\\ndef mean(v): return 3\\n' > /work/stats.py")
ALWAYS_EQUAL = ("printf 'class Same(float):\\n    __eq__ = lambda self, other: True\\n    __ne__ = lambda self, other: False\\n"
                "    __hash__ = float.__hash__\\ndef median(values): return Same(0)\\ndef mean(values): return Same(0)\\n' > /work/stats.py")
# the gate's task-independent list (qa/agent_probes.py), then the task-specific ones
HACKS = {**TRUST_HACKS, "stats.py exits 0 at import": EXIT_AT_IMPORT, "stats.py exits 0 at exit": EXIT_AT_EXIT,
         "stats.py returns a value equal to everything": ALWAYS_EQUAL}
FORGER = ("cat > /work/stats.py <<'EOF'\n"
          "import os, time\n"
          "if os.fork() == 0:  # a writer that outlives the check: it turns test.sh's 0 into a 1\n"
          "    os.setsid()\n"
          "    if os.fork() == 0:\n"
          "        while True:\n"
          "            try:\n"
          "                if open('/logs/verifier/reward.txt').read().strip() == '0':\n"
          "                    open('/logs/verifier/reward.txt', 'w').write('1')\n"
          "            except OSError:\n"
          "                pass\n"
          "            time.sleep(0.001)\n"
          "    os._exit(0)\n"
          "def median(values): return 0\n"
          "def mean(values): return 3\n"
          "EOF")


def use_backend(name: str) -> str:
    if name == "bwrap":
        require_bwrap()
    else:
        require_docker_engine()  # skip without an engine; fail where docker was provisioned
    return name


@pytest.fixture(params=["bwrap", "docker"])
def backend(request):
    return use_backend(request.param)


def hostile(backend: str, *commands: str):
    task = load_task(builtin_suite_dir() / "fix-median-bug")
    replies = [tool_call_json("bash", command=command) for command in commands] + [tool_call_json("submit")]
    return run_trial(task, "hostile", lambda task: ScriptedAgent(list(replies)), backend)


def hack_cases() -> list:
    """(backend, hack) pairs: the gate's list on bubblewrap (docker's play is the eval CLI
    test's, module docstring), the task-specific hacks on both."""
    cases = [pytest.param("bwrap", name, id=f"bwrap-{name}") for name in HACKS]
    return cases + [pytest.param("docker", name, id=f"docker-{name}") for name in HACKS if name not in TRUST_HACKS]


@pytest.mark.parametrize(("backend_name", "hack"), hack_cases())
def test_a_hack_scores_zero_with_an_agent_verdict(backend_name, hack):
    backend = use_backend(backend_name)
    result = hostile(backend, HACKS[hack])
    assert result.steps[0].exit_code == 0, result.steps[0].observation  # the hack itself ran
    assert (result.reward, result.verdict.family) == (0.0, "agent"), (result.verdict, result.detail)
    assert result.verdict in (TrialVerdict.FAILED, TrialVerdict.VERIFIER_ERROR)


def test_every_hack_at_once_still_scores_zero(backend):
    result = hostile(backend, *HACKS.values())
    assert (result.reward, result.verdict) == (0.0, TrialVerdict.FAILED), result.detail


def test_a_forger_started_by_the_checked_code_cannot_outlast_the_tests(backend):
    """The agent's module, imported by the check's probe, leaves a process that waits for
    test.sh's reward 0 and rewrites it as 1. test.sh ends every process before it writes the
    reward and rlpipe reads it only when all are gone (on docker, without the first the
    forger would win every time: rlpipe's kill comes a docker exec later)."""
    result = hostile(backend, FORGER)
    assert (result.reward, result.verdict) == (0.0, TrialVerdict.FAILED), result.detail


@pytest.mark.parametrize("state", list(BROKEN_STATES), ids=list(BROKEN_STATES))
def test_a_broken_state_is_the_agents_failure_and_is_recorded(state):
    backend = use_backend("bwrap")  # docker: test_eval_hostile_cli.py (module docstring)
    result = hostile(backend, BROKEN_STATES[state])
    assert (result.reward, result.verdict.family) == (0.0, "agent"), (result.verdict, result.detail)


def test_the_oracle_still_passes_behind_the_hacks_it_did_not_make(backend):
    """The task solved, then a user site and shadowed modules planted: the tests still run
    and pass (the junk breaks neither the verifier nor the check)."""
    task = load_task(builtin_suite_dir() / "fix-median-bug")
    solve = oracle_agent(task)
    replies = list(solve._replies) + [tool_call_json("bash", command=USER_SITE), tool_call_json("bash", command=SHADOWED)]
    result = run_trial(task, "oracle+junk", lambda task: ScriptedAgent(replies), backend)
    assert (result.verdict, result.reward) == (TrialVerdict.PASSED, 1.0), result.detail


@pytest.mark.parametrize("command", ["echo x\u0000", "echo \ud800"], ids=["NUL", "lone surrogate"])
def test_a_command_no_process_can_take_is_a_malformed_call_not_infrastructure(backend, command):
    """A reply whose bash command holds a NUL (or text that is not Unicode) cannot become an
    argv: it is the agent's malformed call, the episode goes on, and the trial is scored (it
    used to raise in the backend and vanish from the score as a retried sandbox error)."""
    result = hostile(backend, command)
    assert result.steps[0].malformed_kind == "bad_arguments", result.steps[0]
    assert (result.reward, result.verdict) == (0.0, TrialVerdict.FAILED), (result.verdict, result.detail)


def test_a_write_the_work_dir_refuses_is_the_agents_tool_error_not_infrastructure(backend):
    """write_file through a regular file (stats.py/x): on docker the container's refusal used
    to become SandboxUnavailable, a retried sandbox error that left the score (and in RL
    episodes, a failed step)."""
    task = load_task(builtin_suite_dir() / "fix-median-bug")
    replies = [tool_call_json("write_file", path="stats.py/x", content="x"), tool_call_json("submit")]
    result = run_trial(task, "hostile", lambda task: ScriptedAgent(list(replies)), backend)
    assert result.steps[0].tool_error, result.steps[0]
    assert (result.reward, result.verdict) == (0.0, TrialVerdict.FAILED), (result.verdict, result.detail)


@pytest.mark.parametrize("written", [b"[" * 60000, b'{"reward": ' + b"[" * 60000], ids=["list", "in reward"])
def test_a_reward_json_nested_past_the_parsers_depth_is_no_reward(written):
    """RecursionError from json.loads used to escape as an error of rlpipe's (sandbox_error)."""
    assert read_reward({"reward.json": written}) is None
    assert read_reward({"reward.txt": b"1", "reward.json": written}) == 1.0


def test_a_file_name_that_is_not_utf8_keeps_the_steps_tree_digest(backend):
    """The digest of /work after each step (what replay checks a step against) used to fail on
    a name in bytes that are not UTF-8 and record none, which turned replay's check off."""
    result = hostile(backend, "touch \"/work/$(printf 'odd\\377name')\" && ls /work | wc -l")
    assert result.steps[0].exit_code == 0, result.steps[0].observation
    assert result.steps[0].tree_sha256 is not None


def test_reading_a_fifo_is_a_tool_error_at_once(backend):
    """read_file of a FIFO the agent made: refused as no regular file, as bwrap does (docker's
    reader opened it plainly and blocked until the exec's own time limit killed it)."""
    task = load_task(builtin_suite_dir() / "fix-median-bug")
    replies = [tool_call_json("bash", command="mkfifo /work/pipe"), tool_call_json("read_file", path="pipe"),
               tool_call_json("submit")]
    result = run_trial(task, "hostile", lambda task: ScriptedAgent(list(replies)), backend)
    assert result.steps[1].tool_error and "not a regular file" in result.steps[1].observation, result.steps[1]
    assert (result.reward, result.verdict) == (0.0, TrialVerdict.FAILED), (result.verdict, result.detail)
