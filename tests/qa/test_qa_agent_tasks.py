"""The quality gate on a multi-turn env (agent_tasks): each answer is a scripted episode played
in a bubblewrap sandbox (controller/agent_episodes.py gate_verify), judged on the final state.
The shipped env passes, its own probes and the hostile-agent episodes of qa/agent_probes.py
scoring 0; each probe really ran (its verdict says what /work/ans held); and a
verifier that accepts the value anywhere in the file is caught by the probes."""

from __future__ import annotations

import json

import pytest

from rlpipe.controller.agent_episodes import gate_verify
from rlpipe.core.records import Task, Verdict
from rlpipe.envs.agent_tasks import AgentTasksEnv
from rlpipe.qa.agent_probes import PROBES as AGENT_PROBES
from rlpipe.qa.answers import hostile_episodes
from rlpipe.qa.standalone import GateRequest, gate_env
from rlpipe.sandbox.base import Limits
from tests.sandbox._bwrap_support import require_bwrap

pytestmark = pytest.mark.bwrap


def gate(env: AgentTasksEnv):
    return gate_env(GateRequest(env="agent_tasks", samples=2, repeats=2, seed=0, backend="bwrap", workers=2), env,
                    verify_one=gate_verify)


def test_the_shipped_env_passes_and_every_probe_ran_as_scripted():
    require_bwrap()
    from rlpipe.sandbox.bwrap import BwrapSandbox
    from rlpipe.sandbox.pool import SandboxPool

    env = AgentTasksEnv()
    report = gate(env)
    assert report.passed, [finding for check in report.checks for finding in check.findings]
    task = env.tasks("train", 1, seed=4)[0]
    key, value = task.prompt.split()[4], json.loads(task.verifier.payload)["value"]
    with SandboxPool(lambda: BwrapSandbox(Limits(timeout_s=10.0)), size=1) as pool:
        def judged(answer: str) -> Verdict:
            return pool.map(lambda sandbox, text: gate_verify(env, task, text, sandbox), [answer])[0]

        assert judged(task.reference_answer).passed
        details = {name: judged(text) for name, text in env.qa_probe_answers(task)}
        hostile = {name: judged(text) for name, text in hostile_episodes()}
    assert all(verdict.reward == 0.0 for verdict in details.values()), details
    assert len(hostile) == len(AGENT_PROBES) and all(verdict.reward == 0.0 for verdict in hostile.values()), hostile
    probes = next(check for check in report.checks if check.name == "probes")
    assert probes.verifications == len(report.task_ids) * (len(details) + len(AGENT_PROBES))  # the hostile episodes ran too
    assert details["every_digit"].detail == "/work/ans holds '0123456789'"
    assert details["tool_output_line"].detail == f"/work/ans holds '{key}={value}'"
    assert details["prompt_written"].detail.startswith("/work/ans holds 'put the value of")
    assert "at most 1000" in details["value_padded_past_the_bound"].detail
    for not_a_file in ("symlink_to_the_value_file", "symlink_out_of_work", "ans_a_folder", "submit_at_once", "empty_reply",
                       "value_in_another_file"):
        assert details[not_a_file].detail.startswith("no readable /work/ans"), (not_a_file, details[not_a_file])


class ValueAnywhere(AgentTasksEnv):
    """A lenient verifier: passes when the value appears anywhere in /work/ans."""

    def verify(self, task: Task, completion_text: str, sandbox=None) -> Verdict:
        verdict = super().verify(task, completion_text, sandbox)
        value = json.loads(task.verifier.payload)["value"]
        if "holds" in verdict.detail and value in verdict.detail.split("holds", 1)[1]:
            return Verdict(1.0, True, verdict.reason, "value found", verdict.duration_s, verdict.verifier_version)
        return verdict


def test_a_verifier_that_accepts_the_value_anywhere_is_caught_by_the_probes():
    require_bwrap()
    report = gate(ValueAnywhere())
    probes = next(check for check in report.checks if check.name == "probes")
    fooled = {finding.answer for finding in probes.findings}
    assert not report.passed and {"probe:every_digit", "probe:tool_output_line", "probe:every_digit_on_lines"} <= fooled


@pytest.mark.docker
def test_the_hostile_agent_episodes_score_zero_in_docker_too():
    """The same episodes through the RL episode path's verify (gate_verify: the multi-turn
    episode played in a sandbox, then the env's verifier on its final state), on docker."""
    from rlpipe.sandbox.docker_backend import DockerSandbox
    from rlpipe.sandbox.pool import SandboxPool
    from tests.helpers.docker_engine import require_docker_engine

    require_docker_engine()
    env = AgentTasksEnv()
    task = env.tasks("train", 1, seed=4)[0]
    with SandboxPool(lambda: DockerSandbox(Limits(timeout_s=10.0)), size=1) as pool:
        hostile = {name: pool.map(lambda sandbox, text: gate_verify(env, task, text, sandbox), [text])[0]
                   for name, text in hostile_episodes()}
        assert pool.map(lambda sandbox, text: gate_verify(env, task, text, sandbox), [task.reference_answer])[0].passed
    assert len(hostile) == len(AGENT_PROBES) and all(verdict.reward == 0.0 for verdict in hostile.values()), hostile
