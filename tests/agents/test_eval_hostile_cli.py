"""`rlpipe eval` as a user runs it, on tasks whose "solution" is a reward hack: every trial
is in the report and the lake with reward 0, none passes, none is an infrastructure failure
(so none leaves the success rate's denominator), on bubblewrap and on docker.

Each task is fix-median-bug (left broken) whose solution/solve.sh is one probe of the
quality gate's hostile-agent list (rlpipe/qa/agent_probes.py), so the oracle agent plays it.
On docker this is where every probe of that list is played (tests/agents/test_verifier_trust.py
plays each on bubblewrap, and docker's trials cost ten times as much): a probe that fools or
breaks docker's verifier fails here, named by its task.
"""

from __future__ import annotations

import json

import pytest

from rlpipe.qa.agent_probes import PROBES, TRUST_HACKS
from rlpipe.storage.evals import EvalStore
from rlpipe.storage.lake import Lake
from tests.agents.helpers import copy_task
from tests.cli.cli_process import run_rlpipe
from tests.helpers.docker_engine import require_docker_engine
from tests.sandbox._bwrap_support import require_bwrap


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
def test_every_hack_is_recorded_as_the_agents_failure(tmp_path, prefect_api_url, backend):
    require_bwrap() if backend == "bwrap" else require_docker_engine()
    tasks = tmp_path / "tasks"
    for name, command in PROBES.items():
        folder = copy_task(tasks, **{"solution__solve.sh": f"#!/bin/bash\ncd /work\n{command}\n"})
        folder.rename(tasks / name.replace("_", "-"))
    ran = run_rlpipe(["eval", "--tasks", str(tasks), "--agent", "oracle", "--backend", backend, "--json", "--max-attempts", "1",
                      "--lake", str(tmp_path / "lake")], cwd=tmp_path, timeout_s=900, PREFECT_API_URL=prefect_api_url)
    assert ran.returncode == 0, ran.stderr[-3000:]
    output = json.loads(ran.stdout)
    trials = {trial["task_id"]: trial for trial in output["trials"]}
    assert sorted(trials) == sorted(name.replace("_", "-") for name in PROBES)  # every trial reported
    passed = {task: trial["detail"] for task, trial in trials.items() if trial["verdict"] == "passed"}
    assert not passed, passed
    assert {task: trial["reward"] for task, trial in trials.items()} == {task: 0.0 for task in trials}
    # one attempt each (no infrastructure failure retried out of sight), the agent's verdict,
    # and a trust hack's no other than a failed or erring check (a verifier timeout is not one)
    assert {task: trial["family"] for task, trial in trials.items() if trial["family"] != "agent"} == {}
    trust = {name.replace("_", "-") for name in TRUST_HACKS}
    assert {task: trial["verdict"] for task, trial in trials.items()
            if task in trust and trial["verdict"] not in ("failed", "verifier_error")} == {}
    metrics = output["metrics"]
    assert (metrics["scored"], metrics["passed"], metrics["infrastructure_failures"]) == (len(PROBES), 0, 0)
    # and each hack itself ran (every probe exits 0 whatever /work holds): a probe that broke
    # before its attack would score 0 too, and prove nothing
    store = EvalStore(Lake.open(str(tmp_path / "lake")))
    first_steps = {}
    for commit in store.commits(output["eval_id"]):
        _, steps = store.read_trial(commit)
        first_steps[commit.task_id] = (steps[0].tool, steps[0].exit_code, steps[0].observation[-300:])
    assert sorted(first_steps) == sorted(trials)
    did_not_run = {task: step for task, step in first_steps.items() if step[:2] != ("bash", 0)}
    assert not did_not_run, did_not_run
