"""`rlpipe up` serves the train deployment: a run started through Prefect's API the way the
UI's Run button does (`run_deployment` with typed parameters: a partial RunConfig, no run
id) finishes with exactly steps x prompts x group rows in the lake and one point per step in
`up`'s MLflow server, under a run id derived from the flow run; `rlpipe down` then leaves no
process behind: not the servers, not the runner, not the flow run or its workers.

The served `rl-eval/eval` deployment runs an eval stored in a lake (as `rlpipe eval` stores
it) with the number of trials in flight it is given.

Also: `prefect deploy --all` from the repository root (prefect.yaml) registers the pool
deployments onto the work pool, queues and limits `up` created (flows/operations.py).

^C of a `rlpipe train` in a terminal under `up` ends in order: the CLI finds the Prefect
server and the MLflow server from `up`'s state file (no PREFECT_API_URL, no
tracking.mlflow_uri in the config), and after ^C in an RL step it exits 130 with one resume
line, the run is interrupted in the lake, KILLED in `up`'s MLflow server and ended in `up`'s
Prefect server, and nothing of the CLI's is left; then `rlpipe resume` finishes it, and its
Prefect step table holds every step. (This is the suite's ^C with a Prefect server; one
`up` for all of these saves a start of the three servers.)

Last, `down` while a served run trains (holding the one `rlpipe-trainer` slot) stops the run
and its workers too.

`up` runs once for the module, on free ports under a private RLPIPE_HOME; every process it
starts inherits a marker variable, which is how "no process left" finds them, beside the
workers its runs forked from the session's shared zygote, which /proc shows with the zygote's
environment (tests/helpers/processes.py: `shared_zygote_workers`).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.client.schemas.sorting import LogSort
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL, temporary_settings

from rlpipe.agents.evaluation import start_eval
from rlpipe.agents.task_format import load_tasks
from rlpipe.agents.trial import TrialOptions
from rlpipe.controller.builders import build_lake
from rlpipe.core.config import load_config
from rlpipe.storage.evals import EvalStore
from rlpipe.storage.lake import Lake
from rlpipe.storage.local_services import LocalServices, read_live_services
from rlpipe.storage.query import query_trajectories
from tests.agents.helpers import copy_task
from tests.cli.cli_process import REPO_ROOT
from tests.cli.test_signals import (
    ENDED, TOML, check_interrupted, flow_run_states, run_on_pty, step_committed, step_table, wait_for_no_new_worker,
    wait_for_no_process,
)
from tests.durability.cli_runs import Where, cli_env, count_rows, make_where, run_cli
from tests.helpers.processes import shared_zygote_workers
from tests.helpers.ports import free_port
from tests.sandbox._bwrap_support import require_bwrap

STEPS, PROMPTS, GROUP = 2, 4, 4
RUN_TIMEOUT_S = 300  # a hang guard, not a speed check
EVAL_TASKS = ("fix-median-bug", "order-totals", "log-count-errors")


BASE_TOML = f"""
[train]
steps = 120
[rollout]
prompts_per_step = {PROMPTS}
group_size = {GROUP}
[warmstart]
steps = 5
[envs]
heldout_size = 10
"""


def _form(lake: Path) -> dict:
    """What a user changes in the UI's form: a partial RunConfig (the rest: the file's, then defaults)."""
    return {"train": {"steps": STEPS}, "storage": {"lake_uri": str(lake)}}


class Up(NamedTuple):
    env: dict[str, str]
    services: LocalServices
    workers_before: set[int]  # the shared zygote's workers before `up` started (none of its runs')


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """`rlpipe up` once for the module; `rlpipe down` after, which must leave no process."""
    folder = tmp_path_factory.mktemp("up")
    marker = f"rlpipe-up-test-{uuid.uuid4().hex}"
    # Prefect's INFO lines, as a user's `up` has them: the flow runs' progress lines are INFO
    env = cli_env(Where(folder, folder / "unused.toml"), prefect_api_url=None, RLPIPE_UP_TEST_MARKER=marker,
                  PREFECT_LOGGING_LEVEL="INFO")
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    workers_before = shared_zygote_workers()
    started = run_cli(["up", "--prefect-port", str(free_port()), "--mlflow-port", str(free_port())], env, folder)
    try:
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        assert "rl-train/train" in started.stdout
        services = read_live_services(Path(env["RLPIPE_HOME"]))
        assert services is not None and len(services.pids) == 3  # Prefect, MLflow, the deployments' runner
        yield Up(env, services, workers_before)
    finally:
        stopped = run_cli(["down"], env, folder)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert wait_for_no_process(marker) == []
    assert wait_for_no_new_worker(workers_before) == set()


def test_the_ui_on_a_port_other_than_4200_talks_to_its_own_api(up: Up) -> None:
    """The UI's settings name this server's API (the port `up` was given), and a UI page loads:
    with Prefect's default the UI called 4200's API and showed empty pages."""
    api = up.services.prefect_api_url
    assert not api.endswith(":4200/api")
    with urllib.request.urlopen(api.removesuffix("/api") + "/ui-settings", timeout=30) as response:
        assert json.load(response)["api_url"] == api
    with urllib.request.urlopen(up.services.prefect_ui_url, timeout=30) as response:
        page = response.read().decode()
    assert response.status == 200 and "<html" in page.lower()


@pytest.mark.slow
def test_a_run_started_from_the_served_deployment_finishes(up: Up, tmp_path: Path) -> None:
    """A file of 120 steps and the form's 2: the form wins, as `--set train.steps=2` would;
    the flow run's logs, read back from up's server, say each RL step's reward and time; the
    final policy is a registered logged model in up's MLflow server."""
    config_file = tmp_path / "long.toml"
    config_file.write_text(BASE_TOML)
    parameters = {"config_path": str(config_file), "config": _form(tmp_path / "lake")}
    with temporary_settings({PREFECT_API_URL: up.services.prefect_api_url}):
        flow_run = run_deployment("rl-train/train", parameters=parameters, timeout=RUN_TIMEOUT_S)
        assert flow_run.state is not None and flow_run.state.is_completed(), flow_run.state
        run_id = flow_run.name  # flow_run_name is the run id, derived here: <file stem>-<date>-<flow run id>
        assert run_id.startswith("long-") and run_id.endswith(str(flow_run.id).replace("-", "")[:8])
        stored = asyncio.run(_stored_parameters(flow_run.id))
        logs = asyncio.run(_flow_run_logs(flow_run.id))
    assert stored["config"] == _form(tmp_path / "lake") and "run_id" not in stored  # as sent: no JSON string
    lake = build_lake(load_config(None, [f'storage.lake_uri="{tmp_path / "lake"}"']))
    assert lake.committed_steps(run_id) == [1, 2]
    assert count_rows(lake, run_id) == (STEPS * PROMPTS * GROUP,) * 2  # 2 x 4 x 4 = 32 rows, none twice
    mlflow = MlflowClient(tracking_uri=up.services.mlflow_uri)  # up's MLflow server: the config named none
    mlflow_run_id = lake.read_run_info(run_id).mlflow_run_id
    assert [point.step for point in mlflow.get_metric_history(mlflow_run_id, "reward/mean")] == [1, 2]
    # the final policy: a logged model of the run in up's MLflow, registered as version 1 of the run id
    experiment_id = mlflow.get_run(mlflow_run_id).info.experiment_id
    logged = [model for model in mlflow.search_logged_models(experiment_ids=[experiment_id]) if model.source_run_id == mlflow_run_id]
    assert len(logged) == 1 and mlflow.get_model_version(run_id, "1").run_id == mlflow_run_id
    assert [line.split(":")[0] for line in logs if line.startswith("RL step ")] == ["RL step 1/2", "RL step 2/2"], logs
    assert any(line.startswith("MLflow run: http") and mlflow_run_id in line for line in logs), logs  # up's UI


@pytest.mark.slow
def test_the_served_eval_deployment_runs_a_stored_eval_one_trial_at_a_time(up: Up, tmp_path: Path) -> None:
    """`rl-eval/eval` from the API: the eval `rlpipe eval` would have stored (3 tasks, the
    oracle, bubblewrap) runs in the runner with `workers=1`, every trial passes, and no two
    trials overlapped (the flow bounds its own fan-out; a served flow's task runner does not)."""
    require_bwrap()
    tasks = tmp_path / "tasks"
    for name in EVAL_TASKS:
        copy_task(tasks, name=name)
    lake_uri = str(tmp_path / "lake")
    loaded = load_tasks(tasks)
    start_eval(EvalStore(Lake.open(lake_uri)), "served", "oracle", "bwrap", tasks, loaded, TrialOptions(), max_attempts=2)
    with temporary_settings({PREFECT_API_URL: up.services.prefect_api_url}):
        flow_run = run_deployment("rl-eval/eval", parameters={"eval_id": "served", "lake_uri": lake_uri, "workers": 1,
                                                              "mlflow_uri": up.services.mlflow_uri}, timeout=RUN_TIMEOUT_S)
    assert flow_run.state is not None and flow_run.state.is_completed(), flow_run.state
    rows = query_trajectories(Lake.open(lake_uri), "select task_id, verdict, started_at_ms, duration_s from eval_trials "
                                                   "where eval_id = 'served' and final order by started_at_ms")
    trials = [dict(zip(rows.columns, row)) for row in rows.rows]
    assert sorted(trial["task_id"] for trial in trials) == sorted(EVAL_TASKS)
    assert {trial["verdict"] for trial in trials} == {"passed"}, trials
    for earlier, later in zip(trials, trials[1:]):  # workers=1: each trial started after the one before ended
        assert later["started_at_ms"] >= earlier["started_at_ms"] + 1000 * earlier["duration_s"] - 1, trials


@pytest.mark.slow
def test_prefect_deploy_all_from_the_repository_root_registers_the_pool_deployments(up: Up) -> None:
    """prefect.yaml at the root: `prefect deploy --all` works as the README says, onto the
    pool and queues `up` created (flows/operations.py), the nightly schedule inactive."""
    env = dict(up.env, PREFECT_API_URL=up.services.prefect_api_url)
    deployed = subprocess.run([str(Path(sys.executable).parent / "prefect"), "--no-prompt", "deploy", "--all"],
                              cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
    with temporary_settings({PREFECT_API_URL: up.services.prefect_api_url}):
        found = asyncio.run(_pool_view())
    train, queues, limits = found
    assert train["work_queue_name"] == "train" and train["pull"] == str(REPO_ROOT.resolve())
    assert train["schedules"] == [("0 3 * * *", False)]  # declared, off until turned on
    assert train["schema_config"] == "#/definitions/RunConfig"
    assert queues == {"eval": 1, "train": 2, "default": 3}  # eval is served ahead of train
    # tag limits are global limits named tag:<tag> in Prefect 3.9
    assert limits == {"rlpipe-trainer": 1, "rlpipe-sandbox": 8, "tag:verify": 4}


@pytest.mark.slow
def test_ctrl_c_of_a_cli_run_under_up_ends_in_order(up: Up, tmp_path: Path) -> None:
    """The CLI's own PREFECT_HOME tells its processes apart from `up`'s for "no process left"."""
    where = make_where(tmp_path, TOML)
    lake_uri = str(tmp_path / "lake")
    # The config `up`'s users write: no tracking section, so the run reports to up's MLflow.
    where.config_path.write_text(TOML + f'\n[storage]\nlake_uri = "{lake_uri}"\n')
    run_id = f"sig-up-{os.getpid()}"
    env = dict(cli_env(where, prefect_api_url=None), RLPIPE_HOME=up.env["RLPIPE_HOME"])  # up's state file
    workers_before = shared_zygote_workers()
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    result = run_on_pty(["train", str(where.config_path), "--run-id", run_id], env, tmp_path,
                        step_committed(Path(lake_uri), run_id, 1), "int")
    where_stopped = check_interrupted(result, lake_uri, run_id, "SIGINT", 130)  # MLflow: up's server, over HTTP
    assert where_stopped["step"] >= 1 and where_stopped["stage"] != "warm-start"  # step 1 persisted: in its update or later
    assert wait_for_no_process(env["PREFECT_HOME"]) == []  # nothing of the CLI's own is left
    assert wait_for_no_new_worker(workers_before) == set()
    with temporary_settings({PREFECT_API_URL: up.services.prefect_api_url}):  # over a session harness, if any
        assert asyncio.run(flow_run_states(run_id))[0] in ENDED
    # The ^C run resumes to the end, and its Prefect step table then holds every step, also
    # those before the interruption.
    resumed = run_cli(["resume", run_id, "--lake", lake_uri], env, tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert Lake.open(lake_uri).committed_steps(run_id) == [1, 2, 3, 4, 5, 6]
    with temporary_settings({PREFECT_API_URL: up.services.prefect_api_url}):
        assert asyncio.run(flow_run_states(run_id))[1:] == ["COMPLETED"]
        assert [int(row["step"]) for row in asyncio.run(step_table("rlpipe-steps-" + run_id.lower()))] == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_down_stops_a_flow_run_in_progress_and_its_workers(up: Up, tmp_path: Path) -> None:
    """Last in the module: `down` while a served run trains; the fixture then finds nothing to stop."""
    marker = up.env["RLPIPE_UP_TEST_MARKER"]
    with temporary_settings({PREFECT_API_URL: up.services.prefect_api_url}):
        run_deployment("rl-train/train", parameters={"config": _form(tmp_path / "lake")}, timeout=0)
    _wait_until(lambda: len(_workers(marker)) + len(shared_zygote_workers() - up.workers_before) == 2,
                "the run's engine and trainer workers")
    with temporary_settings({PREFECT_API_URL: up.services.prefect_api_url}):
        assert asyncio.run(_trainer_slots_taken()) == 1  # the run holds the one trainer slot (flows/operations.py)
    stopped = run_cli(["down"], up.env, tmp_path)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert wait_for_no_process(marker) == []
    assert wait_for_no_new_worker(up.workers_before) == set()


async def _trainer_slots_taken() -> int:
    async with get_client() as client:
        return (await client.read_global_concurrency_limit_by_name("rlpipe-trainer")).active_slots


def _workers(marker: str) -> list[str]:
    """The run's worker processes that carry the marker: spawned (`python -m rlpipe.workers.main`)
    or forked by the controller's own zygote (its command line is the zygote's; the name,
    /proc/PID/comm, says the kind)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "environ").read_bytes():
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if "rlpipe.workers.main" in line or (entry / "comm").read_text().strip() in ("rlpipe-engine", "rlpipe-trainer"):
                    found.append(line)
        except OSError:
            continue
    return found


def _wait_until(probe, what: str) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not probe():
        assert time.monotonic() < deadline, f"waited {RUN_TIMEOUT_S} s for {what}"
        time.sleep(0.2)


async def _pool_view() -> tuple[dict, dict[str, int], dict[str, int]]:
    async with get_client() as client:
        deployment = await client.read_deployment_by_name("rl-train/train-pool")
        queues = await client.read_work_queues(work_pool_name="rlpipe-cpu")
        global_limits = await client.read_global_concurrency_limits()
        tag_limits = await client.read_concurrency_limits(limit=50, offset=0)
    train = {
        "work_queue_name": deployment.work_queue_name,
        "pull": (deployment.pull_steps or [{}])[0].get("prefect.deployments.steps.set_working_directory", {}).get("directory"),
        "schedules": [(schedule.schedule.cron, schedule.active) for schedule in deployment.schedules],
        "schema_config": deployment.parameter_openapi_schema["properties"]["config"]["$ref"],
    }
    limits = {limit.name: limit.limit for limit in global_limits if not limit.name.startswith("deployment:")}
    assert {limit.tag: limit.concurrency_limit for limit in tag_limits} == {"verify": 4}
    return train, {queue.name: queue.priority for queue in queues}, limits


async def _flow_run_logs(flow_run_id, last_line: str = "RL step 2/2") -> list[str]:
    """The flow run's log lines, once `last_line` arrived: its process ships them in batches,
    the last ones possibly after its final state."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    async with get_client() as client:
        while True:
            logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), sort=LogSort.TIMESTAMP_ASC)
            messages = [log.message for log in logs]
            if any(line.startswith(last_line) for line in messages) or time.monotonic() > deadline:
                return messages
            await asyncio.sleep(1.0)


async def _stored_parameters(flow_run_id) -> dict:
    async with get_client() as client:
        return (await client.read_flow_run(flow_run_id)).parameters
