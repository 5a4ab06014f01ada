"""kill -9 of `rlpipe eval` with some trials committed, then `--resume`: finished trials are not
rerun, and the final table equals an uninterrupted eval's."""

from __future__ import annotations

import json
import os

import pytest

from rlpipe.agents.evaluation import run_eval, start_eval
from rlpipe.agents.task_format import load_tasks
from rlpipe.agents.trial import TrialOptions
from rlpipe.core.errors import ConfigError
from rlpipe.storage.evals import EvalStore
from rlpipe.storage.lake import Lake
from rlpipe.storage.query import query_trajectories
from tests.agents.helpers import copy_task
from tests.cli.cli_process import NARROW, REPO_ROOT, error_lines, run_rlpipe
from tests.sandbox._bwrap_support import require_bwrap

pytestmark = pytest.mark.bwrap
TABLE = "select task_id, verdict, family, ending, reward, steps, tool_calls from eval_trials where eval_id = '{}' and final order by task_id"


def query(tmp_path, sql: str) -> list[dict]:
    result = query_trajectories(Lake.open(str(tmp_path / "lake")), sql)
    return [dict(zip(result.columns, row)) for row in result.rows]


def uninterrupted_eval(tmp_path, tasks, eval_id: str, agent: str) -> None:
    loaded = load_tasks(tasks)
    recorder = start_eval(EvalStore(Lake.open(str(tmp_path / "lake"))), eval_id, agent, "bwrap", tasks, loaded, TrialOptions(), 3)
    run_eval(loaded, agent, "bwrap", workers=2, recorder=recorder)


def test_kill_9_mid_eval_then_resume_reruns_only_unfinished_trials(tmp_path, prefect_api_url):
    require_bwrap()
    tasks = tmp_path / "tasks"
    for name in ("fix-median-bug", "order-totals", "log-count-errors", "repair-json-config"):
        copy_task(tasks, name=name)
    copy_task(tasks, name="dedupe-emails", **{"solution__solve.sh": "#!/bin/sh\ntrue\n"})  # an oracle that fails
    uninterrupted_eval(tmp_path, tasks, "whole", "oracle")
    common = ["eval", "--tasks", str(tasks), "--agent", "oracle", "--lake", "lake", "--workers", "2", "--json"]
    killed = run_rlpipe([*common, "--eval-id", "cut"], cwd=tmp_path, timeout_s=120, RLPIPE_FAILPOINTS="eval-trial-committed@2",
                        PREFECT_API_URL=prefect_api_url)
    assert killed.returncode == -9  # SIGKILL right after the 2nd commit, another trial in flight
    before = query(tmp_path, "select task_id, attempt, started_at_ms from eval_trials where eval_id = 'cut'")
    assert len(before) == 2

    resumed = run_rlpipe(["eval", "--resume", "cut", "--lake", "lake", "--json"], cwd=tmp_path, timeout_s=120,
                         PREFECT_API_URL=prefect_api_url)
    assert resumed.returncode == 0, resumed.stderr
    # 5 tasks, 4 passed (dedupe-emails' solution does nothing); each task has exactly one attempt
    assert json.loads(resumed.stdout)["metrics"]["success_rate"] == 4 / 5
    after = query(tmp_path, "select task_id, attempt, session, started_at_ms from eval_trials where eval_id = 'cut'")
    assert sorted(row["task_id"] for row in after) == sorted(p.name for p in tasks.iterdir())
    assert all(row["attempt"] == 1 for row in after)
    # the 2 trials committed before the kill are the session-0 rows, untouched; the other 3 ran in session 1
    kept = {(row["task_id"], row["started_at_ms"]) for row in after if row["session"] == 0}
    assert kept == {(row["task_id"], row["started_at_ms"]) for row in before}
    assert sum(row["session"] == 1 for row in after) == 3
    assert query(tmp_path, TABLE.format("cut")) == query(tmp_path, TABLE.format("whole"))


def test_resume_refuses_an_unknown_eval_and_other_settings(tmp_path):
    require_bwrap()
    tasks = copy_task(tmp_path / "tasks")
    uninterrupted_eval(tmp_path, tasks, "e", "noop")
    with pytest.raises(ConfigError, match="eval 'e' already exists"):
        uninterrupted_eval(tmp_path, tasks, "e", "noop")
    unknown = run_rlpipe(["eval", "--resume", "nope", "--lake", "lake"], cwd=tmp_path, timeout_s=60)
    assert unknown.returncode == 2 and "holds no eval 'nope'" in error_lines(unknown)[0]
    other = run_rlpipe(["eval", "--resume", "e", "--lake", "lake", "--agent", "oracle"], cwd=tmp_path, timeout_s=60)
    assert other.returncode == 2 and "--agent oracle (the eval has noop)" in error_lines(other)[0]


def test_ctrl_c_mid_eval_commits_the_trial_in_flight_and_resume_runs_only_the_rest(tmp_path, prefect_api_url):
    """^C on the terminal of `rlpipe eval` (one worker, trials of >= 3 s) once a trial is
    committed: the trial in flight (if the next one had started) finishes and is committed,
    the trials not started are not run, exit 130 with one resume line and no traceback;
    `--resume` runs only the rest."""
    from tests.cli.test_signals import run_on_pty

    require_bwrap()
    tasks = tmp_path / "tasks"
    slow = "#!/bin/sh\nsleep 3\n" + (copy_task(tmp_path / "original") / "solution" / "solve.sh").read_text().split("\n", 1)[1]
    names = ("fix-a", "fix-b", "fix-c", "fix-d")
    for name in names:
        renamed = copy_task(tasks, **{"solution__solve.sh": slow})
        renamed.rename(tasks / name)
    commits = tmp_path / "lake" / "evals" / "cut" / "trials"
    env = dict(os.environ, COLUMNS=NARROW, PREFECT_LOGGING_LEVEL="WARNING", RLPIPE_HOME=str(tmp_path / "rlpipe-home"),
               PYTHONPATH=str(REPO_ROOT), PREFECT_API_URL=prefect_api_url, NO_PROXY="127.0.0.1,localhost",
               no_proxy="127.0.0.1,localhost")
    interrupted = run_on_pty(["eval", "--tasks", str(tasks), "--agent", "oracle", "--lake", "lake", "--workers", "1",
                              "--eval-id", "cut"], env, tmp_path, lambda: len(list(commits.glob("*/*/COMMIT.json"))) >= 1,
                             send="int")
    assert interrupted.returncode == 130, interrupted.output[-4000:]
    assert "Traceback" not in interrupted.output, interrupted.output[-4000:]
    # the terminal echoes the ^C as "^C" before the line
    lines = [line[line.index("interrupted"):].strip() for line in interrupted.output.splitlines() if "resume with:" in line]
    assert lines == [f"interrupted (SIGINT); trials in flight were committed; resume with: rlpipe eval --resume cut "
                     f"--lake {Lake.open(str(tmp_path / 'lake')).uri}"], interrupted.output[-4000:]
    before = query(tmp_path, "select task_id, attempt, verdict, started_at_ms from eval_trials where eval_id = 'cut'")
    # the committed one and the one in flight at the signal, if one was (it finished, passed and
    # was committed; on a loaded machine the ^C may land before the next trial started); the
    # others were never started
    assert len(before) in (1, 2) and all(row["verdict"] == "passed" for row in before), before

    resumed = run_rlpipe(["eval", "--resume", "cut", "--lake", "lake", "--json"], cwd=tmp_path, timeout_s=180,
                         PREFECT_API_URL=prefect_api_url)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["metrics"]["success_rate"] == 1.0
    after = query(tmp_path, "select task_id, attempt, session, started_at_ms from eval_trials where eval_id = 'cut'")
    assert sorted(row["task_id"] for row in after) == list(names) and all(row["attempt"] == 1 for row in after)
    assert {(row["task_id"], row["started_at_ms"]) for row in after if row["session"] == 0} == {
        (row["task_id"], row["started_at_ms"]) for row in before}
