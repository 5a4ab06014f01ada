"""The train flow under Prefect's test harness: stages, row counts, the lake as the truth,
MLflow metrics, S3 lake over real HTTP (moto), and what a failing stage leaves behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client

from rlpipe.flows.train import train
from rlpipe.storage.query import query_trajectories
from rlpipe.tasks.builders import build_lake
from tests.flows.runs import tiny_config


def test_tiny_run_commits_every_step_with_exact_rows(tmp_path: Path) -> None:
    config = tiny_config(tmp_path)
    summary = train(config.model_dump_json(), "tiny")
    lake = build_lake(config)
    assert lake.committed_steps("tiny") == [1, 2, 3]
    # 3 steps x 4 prompts x 4 samples = 48 rows, no duplicate (run, step, task, sample)
    result = query_trajectories(
        lake, "select count(*), count(distinct (run_id, step, task_id, sample_idx)) from trajectories"
    )
    assert result.rows == [(48, 48)]
    assert summary.steps_committed == 3
    assert lake.read_status("tiny").state.value == "finished"
    assert lake.read_json("tiny", "evals/before_rl.json") is not None
    assert lake.read_json("tiny", "evals/after_rl.json") is not None
    assert lake.latest_checkpoint("tiny") == 3
    # both domains were sampled and scored
    domains = query_trajectories(lake, "select distinct domain from trajectories order by 1").rows
    assert domains == [("arithmetic",), ("reverse",)]


def test_metrics_reach_mlflow_once_per_step(tmp_path: Path) -> None:
    config = tiny_config(tmp_path)
    summary = train(config.model_dump_json(), "tracked")
    client = MlflowClient(tracking_uri=summary.tracking_uri)
    run = client.get_run(summary.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["rollout.group_size"] == "4"
    assert run.data.tags["rlpipe.lake_uri"] == build_lake(config).uri
    for key in ("reward/mean", "reward/arithmetic", "train/loss", "time/generate_s"):
        assert sorted(point.step for point in client.get_metric_history(summary.mlflow_run_id, key)) == [1, 2, 3], key
    artifacts = {item.path for item in client.list_artifacts(summary.mlflow_run_id, "plots")}
    assert "plots/reward.png" in artifacts


def test_same_run_on_s3_writes_the_same_rows(tmp_path: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    config = tiny_config(tmp_path, 'storage.lake_uri="s3://rlpipe-test/lake"', f'storage.s3_endpoint_url="{s3_endpoint}"')
    summary = train(config.model_dump_json(), "on-s3")
    lake = build_lake(config)
    assert lake.uri.startswith("s3://")
    assert lake.committed_steps("on-s3") == [1, 2, 3]
    assert query_trajectories(lake, "select count(*) from trajectories").rows == [(48,)]
    client = MlflowClient(tracking_uri=summary.tracking_uri)
    assert len(client.get_metric_history(summary.mlflow_run_id, "reward/mean")) == 3


def test_rerunning_a_finished_run_changes_nothing(tmp_path: Path) -> None:
    config = tiny_config(tmp_path)
    train(config.model_dump_json(), "twice")
    lake = build_lake(config)
    before = [lake.read_manifest("twice", step) for step in (1, 2, 3)]
    summary = train(config.model_dump_json(), "twice")  # the lake says: all committed
    assert [lake.read_manifest("twice", step) for step in (1, 2, 3)] == before
    assert query_trajectories(lake, "select count(*) from trajectories").rows == [(48,)]
    client = MlflowClient(tracking_uri=summary.tracking_uri)
    assert len(client.get_metric_history(summary.mlflow_run_id, "reward/mean")) == 3


async def _flow_run_names() -> list[str]:
    async with get_client() as client:
        return [run.name for run in await client.read_flow_runs()]


def test_each_step_is_a_nested_flow_run(tmp_path: Path) -> None:
    import asyncio

    config = tiny_config(tmp_path)
    train(config.model_dump_json(), "nested")
    names = asyncio.run(_flow_run_names())
    assert "nested" in names
    assert {"nested-step-1", "nested-step-2", "nested-step-3"} <= set(names)
