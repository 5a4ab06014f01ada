"""Read back what Prefect recorded of a run: its flow runs (one per `train`/`resume` of the
run, named by run id) and, in each, the task runs of one step, which are named `step-<step>` (a
synchronous run's step) or `<task>-step-<step>` (`rollout`, `train`: a pipelined run's;
`checkpoint`, `publish-for`: flows/steps.py)."""

from __future__ import annotations

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterName


async def step_stage_runs(flow_run_name: str, step: int) -> list[dict[str, list[tuple[str, int]]]]:
    """Per flow run of that name (oldest first): stage -> [(state name, attempts)] of the
    task runs of `step` ("step" for `step-<step>`)."""
    suffix = f"-step-{step}"
    async with get_client() as client:
        flow_runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[flow_run_name])))
        result = []
        for flow_run in sorted(flow_runs, key=lambda run: run.created):
            task_runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
            stages: dict[str, list[tuple[str, int]]] = {}
            for task_run in sorted(task_runs, key=lambda run: run.created):
                if task_run.name == f"step-{step}" or task_run.name.endswith(suffix):
                    stage = "step" if task_run.name == f"step-{step}" else task_run.name.removesuffix(suffix)
                    stages.setdefault(stage, []).append((task_run.state.name, task_run.run_count))
            result.append(stages)
        return result
