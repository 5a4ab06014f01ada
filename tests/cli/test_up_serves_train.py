"""`rlpipe up` serves the train deployment: a run started through Prefect's API the way the
UI's Run button does (`run_deployment` with typed parameters: a partial RunConfig, no run
id) finishes with exactly steps x prompts x group rows in the lake and one point per step in
`up`'s MLflow server, under a run id derived from the flow run; `rlpipe down` then leaves no
process behind: not the servers, not the runner, not the flow run or its workers.

`up` runs on free ports under a private RLPIPE_HOME; every process it starts inherits a
marker variable, which is how "no process left" finds them.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL, temporary_settings

from rlpipe.core.config import load_config
from rlpipe.storage.local_services import read_live_services
from rlpipe.tasks.builders import build_lake
from tests.cli.test_signals import wait_for_no_process
from tests.cli.test_signals_up import free_port
from tests.durability.cli_runs import count_rows, run_cli
from tests.durability.cli_runs import Where, cli_env

STEPS, PROMPTS, GROUP = 2, 4, 4
RUN_TIMEOUT_S = 300  # a hang guard, not a speed check


def _form(lake: Path) -> dict:
    """What a user changes in the UI's form: a partial RunConfig (the rest: defaults)."""
    return {
        "train": {"steps": STEPS},
        "rollout": {"prompts_per_step": PROMPTS, "group_size": GROUP},
        "warmstart": {"steps": 5},
        "envs": {"heldout_size": 10},
        "storage": {"lake_uri": str(lake)},
    }


@pytest.mark.slow
def test_a_run_started_from_the_served_deployment_finishes_and_down_leaves_nothing(tmp_path: Path) -> None:
    marker = f"rlpipe-up-test-{uuid.uuid4().hex}"
    env = cli_env(Where(tmp_path, tmp_path / "unused.toml"), prefect_api_url=None, RLPIPE_UP_TEST_MARKER=marker)
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    started = run_cli(["up", "--prefect-port", str(free_port()), "--mlflow-port", str(free_port())], env, tmp_path)
    try:
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        assert "rl-train/train" in started.stdout
        services = read_live_services(Path(env["RLPIPE_HOME"]))
        assert services is not None and len(services.pids) == 3  # Prefect, MLflow, the deployments' runner
        with temporary_settings({PREFECT_API_URL: services.prefect_api_url}):
            flow_run = run_deployment("rl-train/train", parameters={"config": _form(tmp_path / "lake")},
                                      timeout=RUN_TIMEOUT_S)
            assert flow_run.state is not None and flow_run.state.is_completed(), flow_run.state
            run_id = flow_run.name  # flow_run_name is the run id, derived here: run-<date>-<flow run id>
            assert run_id.startswith("run-") and run_id.endswith(str(flow_run.id).replace("-", "")[:8])
            stored = asyncio.run(_stored_parameters(flow_run.id))
        assert stored["config"] == _form(tmp_path / "lake") and "run_id" not in stored  # as sent: no JSON string
        lake = build_lake(load_config(None, [f'storage.lake_uri="{tmp_path / "lake"}"']))
        assert lake.committed_steps(run_id) == [1, 2]
        assert count_rows(lake, run_id) == (STEPS * PROMPTS * GROUP,) * 2  # 2 x 4 x 4 = 32 rows, none twice
        mlflow = MlflowClient(tracking_uri=services.mlflow_uri)  # up's MLflow server: the config named none
        mlflow_run_id = lake.read_run_info(run_id).mlflow_run_id
        assert [point.step for point in mlflow.get_metric_history(mlflow_run_id, "reward/mean")] == [1, 2]
    finally:
        stopped = run_cli(["down"], env, tmp_path)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert wait_for_no_process(marker) == []


async def _stored_parameters(flow_run_id) -> dict:
    async with get_client() as client:
        return (await client.read_flow_run(flow_run_id)).parameters
