"""Reschedule a deployment's train run whose process died, so that it resumes by itself.

Prefect's flow retries cover a flow that raised, not one whose process was killed (kill -9,
the OOM killer, a lost worker): such a run ends Crashed and stays there. The runner (or
worker) that started the process sees it exit and runs the flow's `on_crashed` hooks; this
one sets the flow run to AwaitingRetry, the state the UI's Retry button sets, a few seconds
ahead. The same runner then runs the same flow run again, whose run id is the same, and the
run resumes from the lake (committed steps skipped, no row twice).

Bounded: a flow run is rescheduled at most `crash_retries` times (a flow parameter, 2 by
default), counted from the Crashed states in its own history, so a run that crashes every
time stops after that many tries, Crashed, its final state's message saying the retries
are spent.

Not rescheduled:
- a run with no deployment (`rlpipe train`: the CLI says `rlpipe resume RUN`);
- a crash the flow-run process reports itself: Prefect does that for an interruption that
  reached the process (SIGTERM from `rlpipe down` or a worker's shutdown, ^C), which is an
  operator's stop, not a failure;
- a process the runner saw end by SIGTERM or SIGINT (its exit status -15 or -2, or 143 and
  130 through a shell), for the same reason;
- an attempt any of whose Crashed states says a signal stopped it, whoever wrote it: the
  flow-run process's own report ("Execution was aborted by a termination signal.", "... an
  interrupt signal.") comes before the runner's, whose message may only say "status code 1".
Not here: what the retry redoes (the lake decides), the dead attempt's open task runs
(flows/stale_task_runs.py).
"""

from __future__ import annotations

import logging
import re
import signal
from datetime import datetime, timedelta, timezone
from typing import Any

from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.states import AwaitingRetry, Crashed

log = logging.getLogger(__name__)

DEFAULT_CRASH_RETRIES = 2
RETRY_DELAY_S = 5.0
_STOP_SIGNALS = {-signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGINT}
_EXIT_STATUS = re.compile(r"status code:?\s*(-?\d+)")  # the runner's "Process exited with status code: -9. ..."
_SIGNAL_WORDS = re.compile(r"(interrupt|termination) signal|SIGTERM|SIGINT|KeyboardInterrupt|TerminationSignal")


def operator_stopped(message: str | None) -> bool:
    """Whether a crash message says the process ended by SIGTERM or SIGINT: the runner's exit
    status, or the flow-run process's own words for a signal."""
    found = _EXIT_STATUS.search(message or "")
    if found is not None and int(found.group(1)) in _STOP_SIGNALS:
        return True
    return _SIGNAL_WORDS.search(message or "") is not None and "SIGKILL" not in (message or "")


def this_attempt(states: list[Any]) -> list[Any]:
    """The states since the flow run last started Running (the attempt that just crashed)."""
    ordered = sorted(states, key=lambda state: state.timestamp)
    starts = [index for index, state in enumerate(ordered) if state.is_running()]
    return ordered[starts[-1]:] if starts else ordered


def crash_retries_used(states: list[Any]) -> int:
    """How many times the flow run has crashed so far (its Crashed states, this one included)."""
    return sum(1 for state in states if state.is_crashed())


async def retry_crashed_run(flow: Any, flow_run: Any, state: Any) -> None:
    """`on_crashed` hook of the train flow: reschedule a deployment's crashed run (see above)."""
    if flow_run.deployment_id is None:
        return
    context = FlowRunContext.get()
    if context is not None and context.flow_run is not None and context.flow_run.id == flow_run.id:
        log.info("flow run %s was stopped in its own process (an interruption): not rescheduled", flow_run.name)
        return
    allowed = int((flow_run.parameters or {}).get("crash_retries", DEFAULT_CRASH_RETRIES))
    async with get_client() as client:
        states = await client.read_flow_run_states(flow_run.id)
        stopped = [crash.message for crash in [*this_attempt(states), state] if crash.is_crashed() and operator_stopped(crash.message)]
        if stopped:
            log.info("flow run %s was stopped by a signal (%s): not rescheduled", flow_run.name, stopped[0])
            return
        crashes = crash_retries_used(states)
        if crashes > allowed:
            message = (f"crashed {crashes} times; its {allowed} crash retries are spent, so it is left Crashed: "
                       f"retry it from the UI once the cause is fixed (last: {state.message})")
            await client.set_flow_run_state(flow_run.id, Crashed(message=message), force=True)
            log.warning("flow run %s %s", flow_run.name, message)
            return
        when = datetime.now(timezone.utc) + timedelta(seconds=RETRY_DELAY_S)
        message = (f"crash retry {crashes} of {allowed}: its process died ({state.message}); "
                   "the same flow run resumes from the lake")
        result = await client.set_flow_run_state(flow_run.id, AwaitingRetry(scheduled_time=when, message=message),
                                                 force=False)
    log.warning("flow run %s crashed; %s (%s)", flow_run.name, message, result.status.value)
