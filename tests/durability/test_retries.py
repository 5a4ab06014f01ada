"""Retries are for the machinery only: a stage that raises an InfraError twice and then
succeeds is retried (its task, `step-N`, with backoff 0.1 s, 0.2 s: tests/conftest.py sets
$RLPIPE_RETRY_BACKOFF_S; 1 s, 2 s by default; the retries take generate's staged rows from
the lake) and the run finishes with exactly its rows; a stage that fails on bad data fails
once, and the error shows in the Prefect flow runs and in `rlpipe runs show --json` (which
names the stage inside the task); an engine worker that dies makes `generate` raise
EngineFailed, which is retried with a fresh worker (`extended`: a mid-run kill in
tests/workers/test_worker_death.py checks that retry in CI).

The failures come from fakes of our own protocols: a domain registered with `register_env`
(the Env protocol over the arithmetic tasks, whose verify raises on chosen calls, counted
across the process) and an engine worker that SIGKILLs itself in a chosen generate call (a
crash point, core/failpoints.py). The flows run in this process under the session's Prefect server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.logging.handlers import APILogHandler
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterName, LogFilter, LogFilterFlowRunId

from rlpipe.controller.builders import build_lake
from rlpipe.core.errors import ConfigError, DatasetError, SandboxUnavailable
from rlpipe.core.records import Task, Verdict
from rlpipe.envs.arithmetic import ArithmeticEnv
from rlpipe.envs.mixture import register_env
from rlpipe.flows.train import train
from rlpipe.orchestration.stage_options import STAGE_OPTIONS, first_retry_delay_s
from rlpipe.storage.query import query_trajectories
from tests.flows.runs import tiny_config
from tests.helpers.prefect_runs import step_stage_runs

pytestmark = pytest.mark.slow

HELDOUT = 6  # verify calls of evaluate(before_rl): 6 held-out tasks of the one domain
PER_STEP = 4 * 4  # verify calls of one step: 4 prompts x 4 samples
FIRST_CALL_OF_STEP_2 = HELDOUT + PER_STEP + 1  # call 23


class FlakyEnv:
    """Arithmetic under another name; verify raises `error` on the calls numbered in `plan`."""

    name = "flaky"
    needs_sandbox = False
    plan: dict[int, Exception] = {}
    calls = 0

    def __init__(self, max_operand: int = 99) -> None:
        self._inner = ArithmeticEnv(max_operand=max_operand)
        self.verifier_version = "flaky/" + self._inner.verifier_version

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        return [
            dataclasses.replace(task, task_id=task.task_id.replace("arithmetic/", "flaky/"), domain=self.name)
            for task in self._inner.tasks(split, count, seed)
        ]

    def verify(self, task: Task, completion_text: str, sandbox: object = None) -> Verdict:
        FlakyEnv.calls += 1
        error = FlakyEnv.plan.get(FlakyEnv.calls)
        if error is not None:
            raise error
        return self._inner.verify(task, completion_text)


register_env("flaky", FlakyEnv)


def _config(tmp_path: Path):
    return tiny_config(tmp_path, "envs.domains={flaky = 1.0}", f"envs.heldout_size={HELDOUT}")


def _arm(plan: dict[int, Exception]) -> None:
    FlakyEnv.calls = 0
    FlakyEnv.plan = plan


def test_infra_error_twice_then_success_is_retried_and_the_run_finishes(tmp_path: Path) -> None:
    # verify of step 2: attempt 1 dies on its first row (call 23), attempt 2 on its first
    # row (call 24), attempt 3 verifies every row
    _arm({
        FIRST_CALL_OF_STEP_2: SandboxUnavailable("docker daemon gone (test)"),
        FIRST_CALL_OF_STEP_2 + 1: SandboxUnavailable("docker daemon gone (test)"),
    })
    config = _config(tmp_path)
    _assert_finished_with_every_row_once(config, "retried", train(config, "retried"))
    runs = asyncio.run(_task_runs("retried", 2))
    assert runs["step"] == ("Completed", 3)  # (state, attempts): verify raised twice inside it
    # generate's rows were staged before verify ran: attempts 2 and 3 took them from the lake
    reused = [m for m in asyncio.run(_flow_run_log_messages("retried")) if m.startswith("step 2: generate's rows were staged")]
    assert len(reused) == 2, reused


def test_bad_data_fails_once_and_shows_in_prefect_and_runs_show(tmp_path: Path) -> None:
    _arm({FIRST_CALL_OF_STEP_2: DatasetError("task flaky/1+2 has no answer (test)", hint="fix the dataset")})
    config = _config(tmp_path)
    with pytest.raises(DatasetError, match="has no answer"):
        train(config, "bad-data")
    assert FlakyEnv.calls == FIRST_CALL_OF_STEP_2  # one attempt: no retry after the bad row
    runs = asyncio.run(_task_runs("bad-data", 2))
    assert runs["step"] == ("Failed", 1)
    # the Prefect UI: the step's rollout task run and the run's flow run are Failed, with the error
    assert "has no answer" in asyncio.run(_task_run_message("bad-data", "step-2"))
    (train_run,) = asyncio.run(_flow_run_states(["bad-data"]))
    assert train_run[0] == "FAILED"
    # the lake: step 1 committed, step 2 not; `rlpipe runs show --json` names step, stage, error
    lake = build_lake(config)
    assert lake.committed_steps("bad-data") == [1]
    shown = subprocess.run(
        [sys.executable, "-m", "rlpipe.cli.main", "runs", "show", "bad-data", "--lake", lake.uri, "--json"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["state"] == "failed"
    assert report["failed_step"] == 2
    assert report["failed_stage"] == "verify"
    assert "DatasetError" in report["error"] and "has no answer" in report["error"]
    assert "failed at step 2 in stage verify" in report["state_detail"]


# `extended` (not CI, for its time): tests/workers/test_worker_death.py's mid-run kill checks the
# same retry in Prefect (step 3's rollout: two attempts) and more (rows and weights equal).
@pytest.mark.extended
def test_engine_worker_death_is_engine_failed_and_the_retry_starts_a_fresh_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The engine worker SIGKILLs itself in its 3rd generate: evaluate(before_rl) is the 1st,
    # step 1's rollouts the 2nd, step 2's the 3rd. The call raises EngineFailed; the retry
    # starts a fresh engine worker (synced to the trainer's weights, no crash point armed).
    monkeypatch.setenv("RLPIPE_FAILPOINTS", "engine-generate@3")
    config = tiny_config(tmp_path)
    _assert_finished_with_every_row_once(config, "engine-retried", train(config, "engine-retried"))
    runs = asyncio.run(_task_runs("engine-retried", 2))
    assert runs["step"] == ("Completed", 2)  # (state, attempts): EngineFailed in generate, then the retry


def _assert_finished_with_every_row_once(config, run_id: str, summary) -> None:  # noqa: ANN001
    lake = build_lake(config)
    assert summary.steps_committed == 3
    assert lake.read_status(run_id).state.value == "finished"
    # 3 steps x 4 prompts x 4 samples, no duplicates: failed attempts and retries left nothing behind
    assert query_trajectories(
        lake, "select count(*), count(distinct (run_id, step, task_id, sample_idx)) from trajectories"
    ).rows == [(48, 48)]


async def _task_runs(flow_run_name: str, step: int) -> dict[str, tuple[str, int]]:
    """stage -> (state name, attempts) of `step`'s task runs in the one flow run of that name."""
    (stages,) = await step_stage_runs(flow_run_name, step)
    assert all(len(runs) == 1 for runs in stages.values()), stages
    return {stage: runs[0] for stage, runs in stages.items()}


async def _task_run_message(flow_run_name: str, task_run_name: str) -> str:
    """The state message of the one task run of that name in the one flow run of that name."""
    async with get_client() as client:
        (flow_run,) = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[flow_run_name])))
        task_runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
        (task_run,) = [run for run in task_runs if run.name == task_run_name]
        return task_run.state.message or ""


async def _flow_run_log_messages(flow_run_name: str) -> list[str]:
    """The log messages Prefect holds for the one flow run of that name (its task runs' included)."""
    await APILogHandler.aflush()  # the lines still queued in this process go to the API first
    async with get_client() as client:
        (flow_run,) = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[flow_run_name])))
        logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id])))
        return [log.message for log in logs]


async def _flow_run_states(names: list[str]) -> list[tuple[str, str]]:
    """(state type, state message) of the one flow run of each name."""
    async with get_client() as client:
        result = []
        for name in names:
            flow_runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
            assert len(flow_runs) == 1, (name, flow_runs)
            state = flow_runs[0].state
            result.append((state.type.value, state.message or ""))
        return result


def test_the_retry_backoff_doubles_from_a_first_delay_the_environment_may_set() -> None:
    assert first_retry_delay_s({}) == 1.0  # the default: 1, 2, 4, 8, 16, 32 s
    assert first_retry_delay_s({"RLPIPE_RETRY_BACKOFF_S": " 0.25 "}) == 0.25
    for bad in ("0", "-1", "abc", "inf", "nan"):
        with pytest.raises(ConfigError, match="RLPIPE_RETRY_BACKOFF_S") as caught:
            first_retry_delay_s({"RLPIPE_RETRY_BACKOFF_S": bad})
        assert caught.value.hint
    # this process: tests/conftest.py set 0.1 s before the stages were defined, unless the
    # environment had its own value; 6 delays, each twice the one before
    first = first_retry_delay_s()
    assert STAGE_OPTIONS["retries"] == 6
    assert STAGE_OPTIONS["retry_delay_seconds"](6) == [first * 2**attempt for attempt in range(6)]
