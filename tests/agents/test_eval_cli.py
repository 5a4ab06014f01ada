"""`rlpipe eval` as a user runs it: --json metrics, the table, and exit 2 for bad input."""

from __future__ import annotations

import json

import pytest

from tests.agents.helpers import copy_task
from tests.cli.cli_process import error_lines, run_rlpipe
from tests.sandbox._bwrap_support import require_bwrap


@pytest.mark.bwrap
def test_json_prints_the_metrics_of_a_folder_of_tasks(tmp_path, prefect_api_url):
    require_bwrap()
    tasks = tmp_path / "tasks"
    copy_task(tasks)
    copy_task(tasks, name="order-totals")
    copy_task(tasks, name="repair-json-config", **{"environment__Dockerfile": "FROM python:3.12\nRUN pip install requests\n"})
    ran = run_rlpipe(["eval", "--tasks", str(tasks), "--agent", "oracle", "--json"], cwd=tmp_path, timeout_s=120,
                     PREFECT_API_URL=prefect_api_url)
    assert ran.returncode == 0, ran.stderr
    output = json.loads(ran.stdout)
    metrics = output["metrics"]
    # 2 tasks scored and passed, 1 skipped (its Dockerfile installs with pip: no network on bwrap): success_rate = 2 / 2
    assert (metrics["success_rate"], metrics["scored"], metrics["not_run"]) == (1.0, 2, 1)
    assert metrics["verdicts"] == {"passed": 2, "skipped": 1}
    assert [trial["verdict"] for trial in output["trials"]] == ["passed", "passed", "skipped"]
    # the eval is an MLflow run (sqlite in the working folder) whose report is a local artifact
    assert output["mlflow"]["tracking_uri"] == f"sqlite:///{tmp_path.resolve() / 'mlruns.db'}"
    report = output["mlflow"]["report"].removeprefix("file://")
    assert "success rate **1.000** (2 of 2 scored trials passed)" in open(report).read()


@pytest.mark.bwrap
def test_the_table_shows_each_task_and_a_zero_success_rate_still_exits_0(tmp_path, prefect_api_url):
    require_bwrap()
    ran = run_rlpipe(["eval", "--tasks", str(copy_task(tmp_path)), "--agent", "noop"], cwd=tmp_path, timeout_s=120, COLUMNS="200",
                     PREFECT_API_URL=prefect_api_url)
    assert ran.returncode == 0, ran.stderr
    assert "fix-median-bug" in ran.stdout and "success_rate = 0.000 (0/1 scored" in ran.stdout


@pytest.mark.parametrize(("args", "error"), [
    (["--tasks", "absent", "--agent", "noop"], "does not exist"),
    (["--agent", "wizard"], "unknown agent 'wizard'"),
])
def test_bad_input_exits_2_with_one_error_line(tmp_path, args, error):
    ran = run_rlpipe(["eval", *args], cwd=tmp_path, timeout_s=60)
    assert ran.returncode == 2
    assert error in error_lines(ran)[0]
