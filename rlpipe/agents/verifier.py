"""A trial's verdict from the task's tests, run where nothing the agent did can reach them.

The trust model (docs/AGENTS.md, "What the verifier trusts"):

- The agent controls /work and whatever its commands did inside the sandbox. Nothing it
  started is running when the tests run: bwrap restores the final state into a new
  sandbox, docker kills every process of the sandbox user after each command.
- The tests are put at /tests by rlpipe, read-only to every process of the sandbox, only
  after the episode (base.VerifierSandbox). No test file passes through /work, and no text
  in them is rewritten: Harbor's /tests and /logs/verifier are where test.sh expects them.
- test.sh runs with HOME=/tmp and PYTHONNOUSERSITE=1 (no user site, .pth or dotfile of the
  agent's), cwd the task's work dir (/work, or e.g. /app: the same folder, also at /work). What test.sh itself runs is the task's business: a check that must
  run the agent's code runs it in another process and compares plain data (the built-in
  suite's tests/probe.py + tests/check.py).
- The reward is read by rlpipe, after the tests and all they started are gone, from
  /logs/verifier/reward.txt (a number) or, where there is no reward.txt at all,
  reward.json ({"reward": x}); passed iff >= 1. A reward.txt that is not a regular file (a
  symlink, a folder) reads as empty: no reward, never a fall back to reward.json.
  A test.sh that a signal ended (exit status above 128: a process it ran may have killed it
  to write a reward of its own) scores 0, and a pass counts only where test.sh exited 0: the
  checked code can write a reward of 1 and lock the file (or put a folder in its place), so
  that test.sh's own write fails and the agent's reward is what is left; such a test.sh
  exits non-zero (its last command, the write, failed), and the trial scores 0. A process
  the agent's code starts while the tests run could still write the reward after test.sh
  did: a test.sh that runs the agent's code ends every process it started before it writes
  the reward (`kill -9 -1` runs as the tests' own uid and spares test.sh itself: the
  built-in suite's do). No process of the tests can trace another (sandbox/programs/
  no_ptrace.py): the agent's code could otherwise rewrite the check's exit status.
- Abstention scores zero: tests past their time limit, or no readable reward on the agent's
  final state, are the agent's failures (reward 0), never infrastructure. Infrastructure is
  only what the host caused: the sandbox could not start or the backend failed
  (SandboxUnavailable, an InfraError, raised to the trial).

What it does not: run the episode (agents/trial.py), or retry (agents/evaluation.py).
"""

from __future__ import annotations

import dataclasses
import json
import math

from rlpipe.agents.backends import TrialBackend
from rlpipe.agents.records import TrialVerdict
from rlpipe.agents.task_records import AgentTask, shebang_interpreter
from rlpipe.sandbox.base import Limits, Sandbox, Snapshot, Workspace

DETAIL_CHARS = 600


@dataclasses.dataclass(frozen=True)
class TestsVerdict:
    """The tests' judgement: a reward (0 when the tests gave none), and a verdict only where
    the reward alone does not say it (the tests timed out, or wrote no reward)."""

    reward: float
    verdict: TrialVerdict | None
    detail: str


def run_tests(sandboxes: TrialBackend, sandbox: Sandbox, final: Snapshot, task: AgentTask, limits: Limits,
              workspace: Workspace = Workspace()) -> TestsVerdict:
    """Run the task's tests/test.sh on the final state `final` (see the module docstring), in a
    sandbox of the trial's `workspace` (its work dir path, variables and image)."""
    verifier_limits = dataclasses.replace(limits, timeout_s=task.limits.verifier_timeout_s)
    checker, fresh = sandboxes.verifier(sandbox, final, verifier_limits, task.limits.cpus, workspace)
    try:
        interpreter = (shebang_interpreter(task.test_files["test.sh"]) or ("sh",))[0]
        run = checker.run_verifier([interpreter, "/tests/test.sh"], dict(task.test_files), task.limits.verifier_timeout_s)
    finally:
        if fresh:
            checker.close()
    output = tail(run.result.stdout + run.result.stderr)
    if run.result.timed_out:
        return TestsVerdict(0.0, TrialVerdict.VERIFIER_TIMEOUT, f"tests ran past {task.limits.verifier_timeout_s:g} s: {output}")
    if run.result.exit_code is None or run.result.exit_code > 128:  # a signal ended test.sh (a process it ran can kill it)
        return TestsVerdict(0.0, TrialVerdict.VERIFIER_ERROR,
                            f"test.sh was killed (exit {run.result.exit_code}): what it wrote is not trusted: {output}")
    reward = read_reward(run.logs)
    if reward is None:
        return TestsVerdict(0.0, TrialVerdict.VERIFIER_ERROR,
                            f"test.sh (exit {run.result.exit_code}) wrote no readable reward on the agent's final state: {output}")
    if reward >= 1.0 and run.result.exit_code != 0:  # its own write failed: the reward read is one the agent left
        return TestsVerdict(0.0, TrialVerdict.VERIFIER_ERROR,
                            f"a passing reward, but test.sh exited {run.result.exit_code}: a reward whose write failed "
                            f"(a file the checked code locked) is not trusted: {output}")
    return TestsVerdict(reward, None, "" if reward >= 1.0 else f"reward {reward:g}: {output}")


def read_reward(logs: dict[str, bytes]) -> float | None:
    """reward.txt (a number), else reward.json ({"reward": x}); None when neither holds a finite number."""
    for name in ("reward.txt", "reward.json"):
        if name not in logs:
            continue
        raw = logs[name].decode("utf-8", errors="replace").strip()
        try:
            value = float(json.loads(raw)["reward"] if name.endswith(".json") else raw)
        except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: "[" * 60000 in reward.json
            return None
        return value if math.isfinite(value) else None
    return None


def tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= DETAIL_CHARS else "..." + text[-DETAIL_CHARS:]
