"""What a run reports while it runs (orchestration/status.py): warm-start metrics in MLflow and the
lake, the links document, and the Prefect step table rebuilt after a resume."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from rlpipe.controller.builders import build_lake
from rlpipe.flows.train import train
from rlpipe.orchestration.track import TABLE_REFRESH_S, table_due
from rlpipe.tasks import step_tasks
from tests.flows.runs import tiny_config


def test_warm_start_reports_loss_and_accuracy_checks_to_mlflow_and_the_lake(tmp_path: Path) -> None:
    # 10 steps, checks every 5 steps strictly before the last one: a check at step 5 only.
    # The target (1.0: every answer right) is out of reach of a random tiny model after 5
    # supervised steps, so the warm start runs its whole budget.
    config = tiny_config(tmp_path, "warmstart.steps=10", "warmstart.check_every_steps=5",
                         "warmstart.target_accuracy=1.0", "warmstart.check_tasks=8")
    summary = train(config, "warm")
    client = MlflowClient(tracking_uri=summary.tracking_uri)
    losses = client.get_metric_history(summary.mlflow_run_id, "warmstart/loss")
    assert sorted(point.step for point in losses) == list(range(1, 11))  # one point per step, 1..10
    checks = client.get_metric_history(summary.mlflow_run_id, "warmstart/accuracy")
    assert [point.step for point in checks] == [5]
    assert 0.0 <= checks[0].value < 1.0

    lake = build_lake(config)
    progress = lake.read_json("warm", "progress/warmstart.json")
    assert progress["steps_done"] == 10 and progress["steps_max"] == 10 and progress["finished"] is True
    assert progress["accuracy_step"] == 5 and progress["accuracy"] == checks[0].value
    assert progress["loss"] == sorted(losses, key=lambda point: point.step)[-1].value

    links = lake.read_json("warm", "links.json")
    assert links["mlflow_run_id"] == summary.mlflow_run_id
    assert links["prefect_flow_run_id"] == summary.prefect_flow_run_id != ""
    # the harness's API URL names a server, so the flow run has a UI address
    assert links["prefect_flow_run_url"].endswith(f"/runs/flow-run/{summary.prefect_flow_run_id}")


def test_step_table_after_a_resume_holds_the_steps_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The update of step 2 fails once (a bug, not retried): the run stops with steps 1 and
    2 committed. Resumed, it replays them and runs step 3; the table still has 1, 2, 3 (the
    rows of a flow run are built in memory, so the resumed one rebuilds the earlier rows)."""
    config = tiny_config(tmp_path)
    real_update = step_tasks.apply_committed_update

    def failing_update(runtime, step: int) -> dict[str, float]:  # noqa: ANN001 - the Runtime
        if step == 2:
            raise ValueError("update fails at step 2 (test)")
        return real_update(runtime, step)

    monkeypatch.setattr(step_tasks, "apply_committed_update", failing_update)
    with pytest.raises(ValueError, match="step 2"):
        train(config, "table")
    monkeypatch.setattr(step_tasks, "apply_committed_update", real_update)
    assert asyncio.run(_table("rlpipe-steps-table")) and build_lake(config).committed_steps("table") == [1, 2]
    train(config, "table")
    rows = asyncio.run(_table("rlpipe-steps-table"))
    assert [row["step"] for row in rows] == [1, 2, 3]
    # every row has its reward (manifest) and its train loss (MLflow: logged by the first
    # flow run for step 1, by the resume's replay for step 2), not NaN (None in JSON)
    assert all(row["train/loss"] is not None and row["reward/mean"] is not None for row in rows)


def test_step_table_is_refreshed_first_then_at_most_every_few_seconds_and_at_the_last_step() -> None:
    assert table_due(None, 100.0, step=7, last_step=20)  # the first step this process tracks
    assert not table_due(100.0, 100.0 + TABLE_REFRESH_S / 2, step=8, last_step=20)
    assert table_due(100.0, 100.0 + TABLE_REFRESH_S, step=9, last_step=20)
    assert table_due(100.0, 100.0, step=20, last_step=20)  # the last step: every row is in the final table


async def _table(key: str) -> list[dict]:
    async with get_client() as client:
        artifacts = await client.read_latest_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        assert len(artifacts) == 1, artifacts
        return json.loads(artifacts[0].data)
