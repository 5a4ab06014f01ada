"""Retry from the UI, end to end through Prefect's API: the train deployment is served by a
runner process of its own (`flow.serve`, on the session's loopback Prefect server), started
with typed parameters (a RunConfig as JSON data, no JSON string, no run id), and one flow
run is made to end badly twice:

1. Failed: the lake cannot take step 2's trajectory parts (a file sits where their folder
   goes), so `step-2` (in its persist stage) exhausts its retries and the flow run
   fails; the fault is removed.
2. Retried as the UI's Retry button does it (state Scheduled named AwaitingRetry, not
   forced): the runner runs the same flow run again; its process is killed with -9 once
   step 2 is committed, and the runner marks the flow run Crashed (its workers follow their
   owner).
3. Nobody retries it: the flow's on_crashed hook, run by the runner, reschedules it
   (flows/crash_retry.py); it finishes from the lake with exactly steps x prompts x group
   rows, none twice, and one MLflow point per step; no task run of the killed attempt is
   left Running (it was: `persist-step-2`, forever, on a Completed flow run). The run id
   was derived from the flow run, so each retry must land on the same run id to resume it.

One run, three flow-run processes: the cheapest way to cover both ends.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import NamedTuple
from uuid import UUID

import pytest
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.states import AwaitingRetry

from rlpipe.controller.builders import build_lake
from rlpipe.core.config import RunConfig
from rlpipe.flows.run_parameters import derive_run_id
from tests.cli.cli_process import REPO_ROOT
from tests.cli.test_signals import wait_for_no_process
from tests.durability.cli_runs import count_rows
from tests.flows.runs import tiny_config

pytestmark = pytest.mark.slow

STEPS, PROMPTS, GROUP = 3, 4, 4
START_AHEAD_S = 5  # the flow run is scheduled this far ahead, so the fault is in place before it runs
HANG_GUARD_S = 300  # a run still going after this is hung: the test fails instead of blocking


class Served(NamedTuple):
    deployment: str
    marker: str


@pytest.fixture(scope="module")
def served(prefect_api_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The train flow served by a runner process of its own, for this module's tests."""
    name = f"ui-retry-{uuid.uuid4().hex[:8]}"
    marker = f"rlpipe-ui-retry-{uuid.uuid4().hex}"
    env = dict(os.environ, PREFECT_API_URL=prefect_api_url, PYTHONPATH=str(REPO_ROOT), RLPIPE_UI_RETRY_MARKER=marker,
               RLPIPE_HOME=str(tmp_path_factory.mktemp("rlpipe-home")), PREFECT_LOGGING_LEVEL="WARNING")
    env.pop("RLPIPE_FAILPOINTS", None)
    log = tmp_path_factory.mktemp("runner") / "runner.log"
    code = f"from rlpipe.flows.train import train; train.serve(name={name!r}, limit=1, print_starting_message=False)"
    with open(log, "wb") as out:
        runner = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        asyncio.run(_wait_for_deployment(f"rl-train/{name}", runner, log))
        yield Served(f"rl-train/{name}", marker)
    finally:
        os.killpg(runner.pid, signal.SIGTERM)
        try:
            runner.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(runner.pid, signal.SIGKILL)
    assert wait_for_no_process(marker) == [], "the runner, a flow run or a worker was left behind"


def _form(folder: Path) -> dict:
    """The typed parameter as the UI sends it: the RunConfig's JSON data (lake and MLflow in `folder`)."""
    return tiny_config(folder, f"train.steps={STEPS}").model_dump(mode="json")


def test_a_run_that_failed_then_crashed_is_retried_through_the_api_and_finishes_with_every_row_once(
        served: Served, tmp_path: Path) -> None:
    config = RunConfig.model_validate(_form(tmp_path))
    lake_runs = tmp_path / "lake" / "runs"
    # 1. Start it from the deployment, without a run id, a few seconds ahead: its run id is
    #    known before it runs (derived from the flow run), so the fault can be laid first.
    flow_run = run_deployment(served.deployment, parameters={"config": _form(tmp_path)}, timeout=0,
                              scheduled_time=datetime.now(timezone.utc) + timedelta(seconds=START_AHEAD_S))
    run_id = derive_run_id(str(flow_run.id), flow_run.expected_start_time, None)
    blocker = tmp_path / "lake" / "trajectories" / f"run_id={run_id}" / "step=2"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a folder")  # step 2's parts cannot be written: persist fails after its retries
    failed = asyncio.run(_wait_for_end(flow_run.id))
    assert failed.is_failed(), failed
    assert build_lake(config).committed_steps(run_id) == [1], failed.message
    blocker.unlink()

    # 2. Retry as the UI does; kill the flow-run process with -9 once step 2 is committed.
    asyncio.run(_retry_as_the_ui_does(flow_run.id))
    _wait(lambda: (lake_runs / run_id / "steps" / "000002" / "MANIFEST.json").exists(), "step 2 committed")
    os.kill(_wait(lambda: _flow_run_pid(served.marker), "the flow-run process"), signal.SIGKILL)
    # 3. Nobody retries it: the runner marks it Crashed and the flow's on_crashed hook reschedules it.
    final = asyncio.run(_wait_for_end(flow_run.id, past_crash=True))
    assert final.is_completed(), final
    history = asyncio.run(_state_history(flow_run.id))
    assert [state.name for state in history].count("Crashed") == 1, history
    crashed_at = next(i for i, state in enumerate(history) if state.name == "Crashed")
    rescheduled = history[crashed_at + 1]
    assert rescheduled.name == "AwaitingRetry" and "crash retry 1 of 2" in rescheduled.message, rescheduled
    assert [path.name for path in lake_runs.iterdir()] == [run_id]  # resumed: no second run
    _assert_every_row_once(config, run_id)
    assert asyncio.run(_open_task_runs(flow_run.id)) == []  # the killed attempt's task runs ended Crashed


def _assert_every_row_once(config: RunConfig, run_id: str) -> None:
    lake = build_lake(config)
    assert lake.committed_steps(run_id) == list(range(1, STEPS + 1))
    assert count_rows(lake, run_id) == (STEPS * PROMPTS * GROUP,) * 2  # 3 x 4 x 4 = 48 rows, none twice
    mlflow = MlflowClient(tracking_uri=config.tracking.mlflow_uri)
    history = mlflow.get_metric_history(lake.read_run_info(run_id).mlflow_run_id, "reward/mean")
    assert sorted(point.step for point in history) == list(range(1, STEPS + 1))  # one point per step


async def _open_task_runs(flow_run_id: UUID) -> list[tuple[str, str]]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async with get_client() as client:
        runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return [(run.name, run.state.name) for run in runs if not run.state.is_final()]


async def _state_history(flow_run_id: UUID) -> list:
    async with get_client() as client:
        states = await client.read_flow_run_states(flow_run_id)
    return sorted(states, key=lambda state: state.timestamp)


async def _retry_as_the_ui_does(flow_run_id: UUID) -> None:
    """The UI's Retry: POST /flow_runs/{id}/set_state {type: SCHEDULED, name: AwaitingRetry}, not forced."""
    async with get_client() as client:
        result = await client.set_flow_run_state(flow_run_id, AwaitingRetry(message="Retry from the UI"), force=False)
    assert result.status.value == "ACCEPT", result


async def _wait_for_end(flow_run_id: UUID, past_crash: bool = False):
    """The flow run's next final state; with past_crash, a Crashed one does not count (it is rescheduled)."""
    deadline = time.monotonic() + HANG_GUARD_S
    async with get_client() as client:
        while time.monotonic() < deadline:
            state = (await client.read_flow_run(flow_run_id)).state
            if state.is_final() and not (past_crash and state.is_crashed()):
                return state
            await asyncio.sleep(0.5)
    raise AssertionError(f"flow run {flow_run_id} still {state.name} after {HANG_GUARD_S} s")


async def _wait_for_deployment(name: str, runner: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    async with get_client() as client:
        while time.monotonic() < deadline:
            assert runner.poll() is None, log.read_text()[-3000:]
            try:
                await client.read_deployment_by_name(name)
                return
            except Exception:  # noqa: BLE001 - not registered yet
                await asyncio.sleep(0.5)
    raise AssertionError(f"deployment {name} not served: {log.read_text()[-3000:]}")


def _run_with_step_1(lake_runs: Path) -> str | None:
    manifests = list(lake_runs.glob("*/steps/000001/MANIFEST.json"))  # runs/<run id>/steps/000001/MANIFEST.json
    return manifests[0].parents[2].name if manifests else None


def _flow_run_pid(marker: str) -> int | None:
    """The runner's flow-run subprocess (multiprocessing's spawn child), by the marker it inherits."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes() and b"spawn_main" in (entry / "cmdline").read_bytes():
                return int(entry.name)
        except OSError:
            continue
    return None


def _wait(probe, what: str):
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"waited {HANG_GUARD_S} s for {what}")

