"""kill -9 of a pipelined run (rollout.max_staleness = 1, dynamic sampling on), then resume:
the finished run equals an uninterrupted one, row for row and bit for bit.

Two kills: one in the flow's thread (inside the update of step 4, while the rollout lane
generates step 5 or has committed it already: either way is a valid moment) and one in the
lane (the 5th verify call of the run, somewhere in steps 2-4's rounds, while the flow's
thread trains). The resume restores the trainer to the version that generates the step
after the last commit and trains the committed steps after it from the lake. Same CLI
subprocesses and checks as test_kill_resume.py.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from rlpipe.storage.lake import Lake
from rlpipe.storage.query import query_trajectories
from tests.durability.cli_runs import cli_env, final_weights, make_where, rows_by_key, run_cli

pytestmark = pytest.mark.slow

STEPS = 5
ASYNC_TOML = f"""\
seed = 7
[train]
steps = {STEPS}
[rollout]
prompts_per_step = 4
group_size = 4
temperature = 1.0
max_staleness = 1
dynamic_sampling = true
max_extra_rounds = 1
[warmstart]
steps = 20
batch_size = 16
[envs]
train_size = 200
heldout_size = 4
max_operand = 4
domains = {{arithmetic = 1.0}}
[checkpoint]
every_steps = 2
"""
KILLS = {"flow-update": "update@4", "lane-verify": "verify@5"}


def _train(root: Path, api: str, name: str, failpoints: str | None) -> dict[str, object]:
    where = make_where(root / name, ASYNC_TOML)
    run_id = f"async-{name}"
    first = run_cli(["train", str(where.config_path), "--run-id", run_id], cli_env(where, api, failpoints), where.folder)
    outcome: dict[str, object] = {"where": where, "run_id": run_id, "first": first}
    if failpoints:
        outcome["committed_after_kill"] = where.lake().committed_steps(run_id)
        outcome["resumed"] = run_cli(["resume", run_id, "--lake", where.lake_uri], cli_env(where, api), where.folder)
    return outcome


def _set_apart(lake: Lake, run_id: str) -> list[tuple[object, ...]]:
    """The rows dynamic sampling set apart (step, task, sample, text, reward), in order."""
    return query_trajectories(lake, f"select step, task_id, sample_idx, completion_text, reward from set_apart "
                                    f"where run_id = '{run_id}' order by 1, 2, 3").rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, prefect_api_url: str) -> dict[str, dict[str, object]]:
    root = tmp_path_factory.mktemp("async-kill-resume")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(_train, root, prefect_api_url, name, spec) for name, spec in KILLS.items()}
        futures["reference"] = pool.submit(_train, root, prefect_api_url, "reference", None)
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", sorted(KILLS))
def test_resumed_async_run_equals_the_uninterrupted_one(runs: dict[str, dict[str, object]], name: str, tmp_path: Path) -> None:
    reference, outcome = runs["reference"], runs[name]
    assert reference["first"].returncode == 0, reference["first"].stderr[-3000:]
    assert outcome["first"].returncode == -9, outcome["first"].stderr[-3000:]
    assert outcome["committed_after_kill"] != list(range(1, STEPS + 1))  # it died before the end
    assert outcome["resumed"].returncode == 0, outcome["resumed"].stderr[-3000:]
    lake, reference_lake = outcome["where"].lake(), reference["where"].lake()
    assert lake.committed_steps(outcome["run_id"]) == list(range(1, STEPS + 1))
    # the rows trained on and the rows set apart, step by step, as the reference's
    assert rows_by_key(lake, outcome["run_id"]) == rows_by_key(reference_lake, reference["run_id"])
    for step in range(1, STEPS + 1):
        resumed, expected = lake.read_manifest(outcome["run_id"], step), reference_lake.read_manifest(reference["run_id"], step)
        assert (resumed.policy_version, resumed.rows) == (expected.policy_version, expected.rows)
        assert [part.rows for part in resumed.set_apart] == [part.rows for part in expected.set_apart]
    assert _set_apart(lake, outcome["run_id"]) == _set_apart(reference_lake, reference["run_id"])
    weights = final_weights(lake, outcome["run_id"], STEPS, tmp_path / "resumed")
    expected_weights = final_weights(reference_lake, reference["run_id"], STEPS, tmp_path / "reference")
    assert weights.keys() == expected_weights.keys()
    for key, tensor in expected_weights.items():
        assert torch.equal(weights[key], tensor), key
