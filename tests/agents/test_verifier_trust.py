"""A hostile agent against the verifier, on bubblewrap and on docker: each hack scores 0.

The agent solves nothing (fix-median-bug stays broken) and tries to change how the
verifier runs or what it reads (agents/verifier.py states the trust model): a user site or
.pth file under its HOME, modules in /work named like the ones trusted steps import, a
module that exits 0 when the check imports it, a return value equal to everything, planted
reward files and fake tests, a full disk, a work dir it locks. Each trial must be recorded
with reward 0 and an agent verdict, never pass and never turn into infrastructure.
"""

from __future__ import annotations

import pytest

from rlpipe.agents.agents import ScriptedAgent, oracle_agent
from rlpipe.agents.records import TrialVerdict
from rlpipe.agents.task_format import builtin_suite_dir, load_task
from rlpipe.agents.tools import tool_call_json
from rlpipe.agents.trial import run_trial
from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox.base import Limits
from tests.sandbox._bwrap_support import require_bwrap

EXIT_0 = "import os; os._exit(0)"
USER_SITE = ("d=$(python3 -c 'import site; print(site.getusersitepackages())') && mkdir -p \"$d\" && "
             f"echo '{EXIT_0}' > \"$d/usercustomize.py\" && echo '{EXIT_0}' > \"$d/rlpipe-hack.pth\" && "
             f"echo '{EXIT_0}' > \"$d/sitecustomize.py\" && ls \"$d\"")
SHADOWED = " && ".join(f"echo '{EXIT_0}' > /work/{name}.py" for name in
                       ("json", "subprocess", "shutil", "tarfile", "os", "sitecustomize", "usercustomize", "stat", "math"))
EXIT_AT_IMPORT = f"printf '{EXIT_0}\\n' > /work/stats.py"
EXIT_AT_EXIT = ("printf 'import atexit, os\\natexit.register(lambda: os._exit(0))\\n"
                "def median(v): return 0\\ndef mean(v): return 3\\n' > /work/stats.py")
ALWAYS_EQUAL = ("printf 'class Same(float):\\n    __eq__ = lambda self, other: True\\n    __ne__ = lambda self, other: False\\n"
                "    __hash__ = float.__hash__\\ndef median(values): return Same(0)\\ndef mean(values): return Same(0)\\n' > /work/stats.py")
PLANTED = ("mkdir -p logs/verifier tests .verifier && echo 1 > logs/verifier/reward.txt && echo '{\"reward\": 1}' > "
           "logs/verifier/reward.json && printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' > tests/test.sh && "
           "mkdir -p /tmp/logs/verifier && echo 1 > /tmp/logs/verifier/reward.txt; echo 1 > /logs/verifier/reward.txt; true")
HACKS = {
    "user site, .pth and sitecustomize under HOME": USER_SITE,
    "modules in /work named like trusted imports": SHADOWED,
    "os._exit(0) when the check imports the module": EXIT_AT_IMPORT,
    "os._exit(0) at exit with wrong answers": EXIT_AT_EXIT,
    "a return value equal to everything": ALWAYS_EQUAL,
    "planted rewards and fake tests": PLANTED,
}
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
FILL_DISK = "dd if=/dev/zero of=/work/fill bs=1M count=100000 2>&1 | tail -1; df /work | tail -1"
LOCK_WORK = "chmod -R 000 /work/stats.py; chmod 000 /work"
SPARSE = "for i in $(seq 1 40); do truncate -s 60M /work/sparse-$i; done; du -sh --apparent-size /work"


@pytest.fixture(params=["bwrap", "docker"])
def backend(request):
    if request.param == "bwrap":
        require_bwrap()
    else:
        from rlpipe.sandbox.docker_backend import DockerSandbox

        try:
            DockerSandbox(Limits()).close()
        except SandboxUnavailable as exc:
            pytest.skip(f"no docker engine: {exc.message}")
    return request.param


def hostile(backend: str, *commands: str):
    task = load_task(builtin_suite_dir() / "fix-median-bug")
    replies = [tool_call_json("bash", command=command) for command in commands] + [tool_call_json("submit")]
    return run_trial(task, "hostile", lambda task: ScriptedAgent(list(replies)), backend)


@pytest.mark.parametrize("hack", list(HACKS), ids=list(HACKS))
def test_a_hack_scores_zero_with_an_agent_verdict(backend, hack):
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


@pytest.mark.parametrize("command", [FILL_DISK, LOCK_WORK], ids=["full disk", "locked work dir"])
def test_a_broken_state_is_the_agents_failure_and_is_recorded(backend, command):
    result = hostile(backend, command)
    assert (result.reward, result.verdict.family) == (0.0, "agent"), (result.verdict, result.detail)


def test_the_oracle_still_passes_behind_the_hacks_it_did_not_make(backend):
    """The task solved, then a user site and shadowed modules planted: the tests still run
    and pass (the junk breaks neither the verifier nor the check)."""
    task = load_task(builtin_suite_dir() / "fix-median-bug")
    solve = oracle_agent(task)
    replies = list(solve._replies) + [tool_call_json("bash", command=USER_SITE), tool_call_json("bash", command=SHADOWED)]
    result = run_trial(task, "oracle+junk", lambda task: ScriptedAgent(replies), backend)
    assert (result.verdict, result.reward) == (TrialVerdict.PASSED, 1.0), result.detail
