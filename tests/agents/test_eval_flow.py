"""The rl-eval flow on the session's Prefect harness: one task run per trial, a sandbox death
retried as a Prefect retry of that trial's task run, the summary artifacts, the MLflow run."""

from __future__ import annotations

import asyncio

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId

from rlpipe.agents.evaluation import start_eval
from rlpipe.agents.task_format import load_tasks
from rlpipe.agents.trial import TrialOptions
from rlpipe.flows.eval import run_eval_flow
from rlpipe.storage.evals import EvalStore
from rlpipe.storage.lake import Lake
from rlpipe.storage.query import query_trajectories
from tests.agents.helpers import copy_task
from tests.agents.test_eval_record import FlakyBwrap
from tests.sandbox._bwrap_support import require_bwrap

pytestmark = pytest.mark.bwrap


@pytest.fixture
def flaky_backend():
    return FlakyBwrap(deaths=1)


async def _flow_records(flow_run_id: str, key: str) -> tuple[dict[str, tuple[str, int]], list]:
    async with get_client() as client:
        runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        artifacts = await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key, f"{key}-trials"])))
    return {run.name: (run.state.name, run.run_count) for run in runs}, artifacts


def test_the_flow_runs_one_task_run_per_trial_retries_a_dead_sandbox_and_leaves_a_summary(prefect_api_url, tmp_path, flaky_backend):
    require_bwrap()
    tasks_dir = tmp_path / "tasks"
    copy_task(tasks_dir)
    copy_task(tasks_dir, name="order-totals")
    lake = Lake.open(str(tmp_path / "lake"))
    start_eval(EvalStore(lake), "flow-e1", "oracle", "flaky", tasks_dir, load_tasks(tasks_dir), TrialOptions(), 3)
    summary = run_eval_flow("flow-e1", lake.uri, workers=2, max_attempts=3, mlflow_uri=f"sqlite:///{tmp_path / 'mlruns.db'}",
                            trial_backend=flaky_backend)
    # both passed; the one sandbox death was retried: 3 attempts for 2 tasks
    assert (summary.metrics["success_rate"], summary.metrics["attempts"], summary.metrics["infrastructure_retries"]) == (1.0, 3, 1)
    runs, artifacts = asyncio.run(_flow_records(summary.prefect_flow_run_id, "rlpipe-eval-flow-e1"))
    trials = {name: state for name, state in runs.items() if name in ("fix-median-bug", "order-totals")}
    # one task run per trial; the dead sandbox is one retry (run_count 2) of whichever trial opened it first
    assert len(trials) == 2 and sorted(trials.values()) == [("Completed", 1), ("Completed", 2)]
    assert sorted(name.rsplit("-", 1)[0] for name in runs if name not in trials) == ["open-eval", "summarize-eval"]
    kinds = sorted(artifact.type for artifact in artifacts)
    assert kinds == ["markdown", "table"]
    markdown = next(a for a in artifacts if a.type == "markdown").data
    assert "success rate **1.000** (2/2 scored)" in markdown and summary.tracking.mlflow_run_id in markdown
    rows = query_trajectories(lake, "select family, count(*) from eval_trials where eval_id = 'flow-e1' group by 1 order by 1").rows
    assert rows == [("agent", 2), ("infrastructure", 1)]


def test_a_trial_the_lake_cannot_take_is_named_in_the_summary_not_dropped(prefect_api_url, tmp_path, monkeypatch):
    """The recorder fails for one task (a lake that refuses the write): the flow goes on, and
    the summary names the task as unrecorded (`rlpipe eval` then exits 1 naming it), instead of
    a report that silently lacks it."""
    require_bwrap()
    from rlpipe.agents.recording import EvalRecorder

    tasks_dir = tmp_path / "tasks"
    copy_task(tasks_dir)
    copy_task(tasks_dir, name="order-totals")
    lake = Lake.open(str(tmp_path / "lake"))
    start_eval(EvalStore(lake), "flow-e2", "oracle", "bwrap", tasks_dir, load_tasks(tasks_dir), TrialOptions(), 1)
    record = EvalRecorder.record

    def refuse_one(self, attempt, result, instruction):
        if result.task_id == "order-totals":
            raise OSError(28, "No space left on device")
        return record(self, attempt, result, instruction)

    monkeypatch.setattr(EvalRecorder, "record", refuse_one)
    summary = run_eval_flow("flow-e2", lake.uri, workers=1, max_attempts=1, track=False)
    assert summary.unrecorded == ("order-totals",)
    assert [trial.task_id for trial in summary.report.trials] == ["fix-median-bug"]
