"""The train flow's on_crashed hook (flows/crash_retry.py) on the session's Prefect server:
a deployment's crashed run is rescheduled as the UI's Retry does it, at most `crash_retries`
times; an operator's stop, a run without a deployment and a crash seen inside the flow-run
process are left alone. The whole path (a runner, kill -9, the run resumed and finished
from the lake) is tests/flows/test_ui_retry.py."""

from __future__ import annotations

import asyncio
import uuid

from prefect.client.orchestration import get_client
from prefect.states import Crashed, Running

from rlpipe.flows.crash_retry import operator_stopped, retry_crashed_run

KILLED = "Process exited with status code: -9. This indicates that the process exited due to a SIGKILL signal."


def test_a_crashed_deployment_run_is_rescheduled_until_its_crash_retries_are_spent(prefect_api_url: str) -> None:
    names = asyncio.run(_crash_repeatedly(crash_retries=2, times=3))
    assert names == ["AwaitingRetry", "AwaitingRetry", "Crashed"]  # two retries, then left Crashed


def test_crash_retries_zero_leaves_the_run_crashed_saying_the_retries_are_spent(prefect_api_url: str) -> None:
    assert asyncio.run(_crash_repeatedly(crash_retries=0, times=1)) == ["Crashed"]
    assert "crash retries are spent" in asyncio.run(_crash_repeatedly(crash_retries=0, times=1, final_message=True))


def test_a_stop_the_flow_process_reported_is_not_rescheduled_whatever_the_runner_says(prefect_api_url: str) -> None:
    """SIGTERM to a deployment's flow-run process: Prefect's engine there reports the crash in its
    own words, and the runner's message that follows names no signal."""
    for own_words in ("Execution was aborted by a termination signal.", "Execution was aborted by an interrupt signal."):
        after = asyncio.run(_crash_repeatedly(crash_retries=2, times=1, message="Process exited with status code: 1.",
                                              reported_first=own_words))
        assert after == ["Crashed"], own_words


def test_an_operator_stop_and_a_run_without_a_deployment_are_not_rescheduled(prefect_api_url: str) -> None:
    stopped = "Process exited with status code: -15. This indicates that the process exited due to a SIGTERM signal."
    assert asyncio.run(_crash_repeatedly(crash_retries=2, times=1, message=stopped)) == ["Crashed"]
    assert asyncio.run(_crash_repeatedly(crash_retries=2, times=1, deployment=False)) == ["Crashed"]


def test_the_runner_exit_status_is_read_from_its_message() -> None:
    assert operator_stopped("Process exited with status code: -15. ...") and operator_stopped("status code: 130")
    assert not operator_stopped(KILLED) and not operator_stopped("Process exited with status code: 1.")
    assert not operator_stopped(None) and not operator_stopped("Execution was interrupted")
    assert operator_stopped("Execution was aborted by a termination signal.")
    assert operator_stopped("Execution was aborted by an interrupt signal.")


async def _crash_repeatedly(crash_retries: int, times: int, message: str = KILLED, deployment: bool = True,
                            reported_first: str | None = None, final_message: bool = False) -> list[str] | str:
    """Crash one flow run `times` times (the hook called as the runner calls it after each, with
    `message`; `reported_first`: a Crashed state the flow-run process set before); the state
    names it was left in after each crash (`final_message`: the last state's message instead)."""
    async with get_client() as client:
        flow_id = await client.create_flow_from_name(f"crash-retry-{uuid.uuid4().hex[:8]}")
        if deployment:
            deployment_id = await client.create_deployment(flow_id=flow_id, name="crash-retry")
            flow_run = await client.create_flow_run_from_deployment(deployment_id, parameters={"crash_retries": crash_retries})
        else:
            flow_run = await client.create_flow_run(_flow_without_deployment(), parameters={})
        after = []
        for _ in range(times):
            await client.set_flow_run_state(flow_run.id, Running(), force=True)
            if reported_first is not None:
                await client.set_flow_run_state(flow_run.id, Crashed(message=reported_first), force=True)
            crashed = Crashed(message=message)
            await client.set_flow_run_state(flow_run.id, crashed, force=True)
            await retry_crashed_run(None, await client.read_flow_run(flow_run.id), crashed)
            after.append((await client.read_flow_run(flow_run.id)).state.name)
        final = (await client.read_flow_run(flow_run.id)).state.message
        if deployment:
            await client.delete_deployment(deployment_id)
    return final if final_message else after


def _flow_without_deployment():  # noqa: ANN202 - a prefect Flow (create_flow_run takes one)
    from prefect import flow

    @flow(name="crash-retry-no-deployment")
    def no_deployment() -> None:
        """A flow run with no deployment, as `rlpipe train` makes."""

    return no_deployment
