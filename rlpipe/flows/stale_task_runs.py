"""End the task runs a dead attempt of this flow run left open.

A flow-run process killed with -9 (or an OOM kill, a lost machine) cannot report its running
task runs' end: they stay Running in Prefect forever, also after a retry of the flow run
has finished (seen: `persist-step-2` Running on a Completed run). A retried flow run is the
only process of that flow run, so every task run of it that is not final when the retry
starts belongs to a dead attempt: it is set Crashed, saying so.

Only retries (run count > 1) look: a first attempt has no task runs yet, and `rlpipe train`
starts a new flow run each time (no API call is added to it).

Not here: what the retry redoes (the lake decides: flows/train.py, tasks/lifecycle.py).
"""

from __future__ import annotations

import logging

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterState, TaskRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.runtime import flow_run
from prefect.states import Crashed

log = logging.getLogger(__name__)


def crash_stale_task_runs() -> list[str]:
    """Set Crashed every non-final task run of this flow run when it is a retry; return their names."""
    flow_run_id = flow_run.get_id()
    if flow_run_id is None or flow_run.get_run_count() <= 1:
        return []
    ended = []
    try:
        with get_client(sync_client=True) as client:
            open_states = TaskRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED])
            task_runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
                task_run_filter=TaskRunFilter(state=TaskRunFilterState(type=open_states)),
            )
            for task_run in task_runs:
                was = task_run.state.name if task_run.state else "open"
                message = f"its process died ({was} when the flow run was retried); the retry redoes what the lake lacks"
                client.set_task_run_state(task_run.id, Crashed(message=message), force=True)
                ended.append(task_run.name)
    except Exception as exc:  # noqa: BLE001 - a cosmetic fix of the record must never stop the retry
        log.warning("could not end the task runs of the dead attempt: %s", exc)
    return ended
