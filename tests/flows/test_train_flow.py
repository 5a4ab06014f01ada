"""The train flow under Prefect's test harness: stages, row counts, the lake as the truth,
MLflow metrics, S3 lake over real HTTP (moto), and what a failing stage leaves behind.

The tests that only read a finished run share one (`tiny_run`, once per module); a test
that changes or reruns a run makes its own."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import NamedTuple

import pytest
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from transformers import AutoModelForCausalLM

from rlpipe.controller.builders import build_lake
from rlpipe.core.config import RunConfig
from rlpipe.flows.train import TrainSummary, train
from rlpipe.orchestration.track import MODEL_ARTIFACT
from rlpipe.storage.lake import Lake
from rlpipe.storage.query import query_trajectories
from rlpipe.workers.policy_export import export_policy
from tests.flows.runs import tiny_config
from tests.helpers.prefect_runs import step_stage_runs
from tests.helpers.s3_server import unique_bucket


class FinishedRun(NamedTuple):
    run_id: str
    config: RunConfig
    summary: TrainSummary
    lake: Lake


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    """One finished 3-step run on a local lake, for the tests that only read it."""
    config = tiny_config(tmp_path_factory.mktemp("tiny"))
    summary = train(config, "tiny")
    return FinishedRun("tiny", config, summary, build_lake(config))


def _rows(lake: Lake, run_id: str) -> dict[tuple[int, str, int], tuple[str, float | None]]:
    """(step, task_id, sample_idx) -> (completion text, reward) of a run's committed rows."""
    result = query_trajectories(
        lake, f"select step, task_id, sample_idx, completion_text, reward from trajectories where run_id = '{run_id}'"
    )
    return {(int(r[0]), str(r[1]), int(r[2])): (r[3], r[4]) for r in result.rows}


def test_tiny_run_commits_every_step_with_exact_rows(tiny_run: FinishedRun) -> None:
    lake, run_id = tiny_run.lake, tiny_run.run_id
    assert lake.committed_steps(run_id) == [1, 2, 3]
    # 3 steps x 4 prompts x 4 samples = 48 rows, no duplicate (run, step, task, sample)
    result = query_trajectories(
        lake, "select count(*), count(distinct (run_id, step, task_id, sample_idx)) from trajectories"
    )
    assert result.rows == [(48, 48)]
    assert tiny_run.summary.steps_committed == 3
    assert lake.read_status(run_id).state.value == "finished"
    assert lake.read_json(run_id, "evals/before_rl.json") is not None
    assert lake.read_json(run_id, "evals/after_rl.json") is not None
    assert lake.latest_checkpoint(run_id) == 3
    # both domains were sampled and scored
    domains = query_trajectories(lake, "select distinct domain from trajectories order by 1").rows
    assert domains == [("arithmetic",), ("reverse",)]


def test_metrics_reach_mlflow_once_per_step(tiny_run: FinishedRun) -> None:
    summary = tiny_run.summary
    client = MlflowClient(tracking_uri=summary.tracking_uri)
    run = client.get_run(summary.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["rollout.group_size"] == "4"
    assert run.data.tags["rlpipe.lake_uri"] == tiny_run.lake.uri
    for key in ("reward/mean", "reward/arithmetic", "train/loss", "time/generate_s"):
        assert sorted(point.step for point in client.get_metric_history(summary.mlflow_run_id, key)) == [1, 2, 3], key
    artifacts = {item.path for item in client.list_artifacts(summary.mlflow_run_id, "plots")}
    assert "plots/reward.png" in artifacts


def test_each_step_is_one_task_run_of_the_runs_flow_run_and_logs_each_stage(tiny_run: FinishedRun) -> None:
    names = asyncio.run(_flow_run_names())
    assert "tiny" in names and not any("-step-" in name for name in names)  # no nested flow run per step
    for step in (1, 2, 3):
        (stages,) = asyncio.run(step_stage_runs("tiny", step))
        # step-N (sample .. persist, update, sync, track), once; step 3 is also the final
        # checkpoint-step-3
        per_step = {stage: [state for state, _ in runs] for stage, runs in stages.items() if stage != "checkpoint"}
        assert per_step == {"step": ["Completed"]}, (step, stages)
        timed = dict(tiny_run.lake.read_train_metrics(tiny_run.run_id, step).metrics)
        stage_names = ("sample", "generate", "verify", "advantages", "persist", "update", "sync")
        assert {f"time/{stage}_s" for stage in stage_names} <= set(timed), timed  # each stage inside the task is timed


def test_same_run_on_s3_writes_the_same_rows(
    tmp_path: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, tiny_run: FinishedRun
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    bucket = unique_bucket("rlpipe-test")
    config = tiny_config(tmp_path, f'storage.lake_uri="s3://{bucket}/lake"', f'storage.s3_endpoint_url="{s3_endpoint}"')
    summary = train(config, "on-s3")
    lake = build_lake(config)
    assert lake.uri.startswith("s3://")
    assert lake.committed_steps("on-s3") == [1, 2, 3]
    # the same config and seed as tiny_run (seeds derive from the run's seed, not its id):
    # the same 48 rows, text for text and reward for reward, whatever the lake
    on_s3 = _rows(lake, "on-s3")
    assert len(on_s3) == 48
    assert on_s3 == _rows(tiny_run.lake, tiny_run.run_id)
    client = MlflowClient(tracking_uri=summary.tracking_uri)
    assert len(client.get_metric_history(summary.mlflow_run_id, "reward/mean")) == 3


def test_rerunning_a_finished_run_changes_nothing(tmp_path: Path) -> None:
    config = tiny_config(tmp_path)
    train(config, "twice")
    lake = build_lake(config)
    before = [lake.read_manifest("twice", step) for step in (1, 2, 3)]
    summary = train(config, "twice")  # the lake says: all committed
    assert [lake.read_manifest("twice", step) for step in (1, 2, 3)] == before
    assert query_trajectories(lake, "select count(*) from trajectories").rows == [(48,)]
    client = MlflowClient(tracking_uri=summary.tracking_uri)
    assert len(client.get_metric_history(summary.mlflow_run_id, "reward/mean")) == 3


def test_final_policy_and_links_reach_mlflow_and_prefect(tiny_run: FinishedRun, tmp_path: Path) -> None:
    """The end of the run logged the final checkpoint's policy (an HF folder) as MLflow
    artifacts model/, byte for byte; the MLflow run links to the flow run and the lake, and the
    flow run's artifact rlpipe-links-tiny to the MLflow run."""
    summary, lake = tiny_run.summary, tiny_run.lake
    client = MlflowClient(tracking_uri=summary.tracking_uri)
    tags = client.get_run(summary.mlflow_run_id).data.tags
    assert tags["rlpipe.model_step"] == "3"
    logged = Path(client.download_artifacts(summary.mlflow_run_id, MODEL_ARTIFACT, str(tmp_path / "mlflow")))
    exported = export_policy(lake, "tiny", tmp_path / "lake")
    assert exported.step == 3 and sorted(p.name for p in logged.iterdir()) == list(exported.files)
    assert all((logged / name).read_bytes() == (exported.folder / name).read_bytes() for name in exported.files)
    assert AutoModelForCausalLM.from_pretrained(logged, local_files_only=True).config.model_type == "qwen2"
    assert tags["prefect.flow_run_id"] == summary.prefect_flow_run_id
    assert tags["prefect.flow_run_url"] == summary.prefect_flow_run_url  # the harness names a server
    assert tags["rlpipe.run_uri"] == f"{lake.uri.rstrip('/')}/runs/tiny"
    assert summary.prefect_flow_run_url in tags["mlflow.note.content"]
    assert summary.mlflow_run_id in asyncio.run(_artifact_markdown("rlpipe-links-tiny"))


async def _artifact_markdown(key: str) -> str:
    async with get_client() as client:
        (artifact,) = await client.read_latest_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        return str(artifact.data)


async def _flow_run_names() -> list[str]:
    async with get_client() as client:
        return [run.name for run in await client.read_flow_runs()]
