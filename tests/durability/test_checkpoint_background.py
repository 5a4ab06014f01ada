"""Checkpoints written in the background, kept by retention, and a disk that fills.

The real CLI in subprocesses, 4 steps of the small config with a checkpoint every step, the
2 newest kept (checkpoint.keep_last) and held-out evaluations every 2 steps (so a "best"
exists). Three runs side by side:
  - reference: uninterrupted;
  - kill: SIGKILL in the background write of checkpoint 2 (the 2nd file written; the
    controller has gone on), then `rlpipe resume`;
  - enospc: ENOSPC injected at the same write (core/failpoints.py `:enospc`), then
    `rlpipe resume` once "space is freed" (no failpoint).
Each resumed run must end with exactly the reference's rows and final weights, no partial
checkpoint folder, and the checkpoints that retention promises; the failed run must print
one error line naming the full disk, and status.json must say the same.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from rlpipe.storage.checkpoint_retention import RetentionRule, evaluated_accuracies, kept_reasons
from tests.durability.cli_runs import (
    SMALL_TOML,
    checkpoint_file_count,
    cli_env,
    count_rows,
    final_weights,
    make_where,
    rows_by_key,
    run_cli,
)

pytestmark = pytest.mark.slow

STEPS = 4
TOML = (SMALL_TOML.replace("steps = 5\n[rollout]", f"steps = {STEPS}\n[rollout]")
        .replace("[checkpoint]\nevery_steps = 2\n", "[checkpoint]\nevery_steps = 1\nkeep_last = 2\n") + "[eval]\nevery_steps = 2\n")
RULE = RetentionRule(keep_last=2, max_staleness=0, keep_reference=False)


def _run(root: Path, api: str, name: str, failpoints: str | None) -> dict:
    where = make_where(root / name, toml=TOML)
    run_id = f"bg-{name}"
    first = run_cli(["train", str(where.config_path), "--run-id", run_id], cli_env(where, api, failpoints), where.folder)
    outcome: dict = {"where": where, "run_id": run_id, "first": first}
    if failpoints is None:
        return outcome
    lake = where.lake()
    outcome["after_failure"] = {
        "listed": lake.checkpoints.listed_steps(run_id), "complete": lake.checkpoint_steps(run_id),
        "committed": lake.committed_steps(run_id), "status": lake.read_status(run_id),
    }
    outcome["resumed"] = run_cli(["resume", run_id, "--lake", where.lake_uri], cli_env(where, api), where.folder)
    return outcome


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, prefect_api_url: str) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("checkpoint-background")
    files = checkpoint_file_count(root / "probe")
    second_file_of_checkpoint_2 = 2 * files + 2  # checkpoints 0 and 1 hit it `files` times each
    specs = {"reference": None, "kill": f"checkpoint-write@{second_file_of_checkpoint_2}",
             "enospc": f"checkpoint-write@{second_file_of_checkpoint_2}:enospc"}
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(_run, root, prefect_api_url, name, spec) for name, spec in specs.items()}
        return {name: future.result() for name, future in futures.items()}


def test_a_kill_during_a_background_write_leaves_the_previous_checkpoint(runs: dict[str, dict]) -> None:
    outcome = runs["kill"]
    assert outcome["first"].returncode == -9, outcome["first"].stderr[-3000:]
    after = outcome["after_failure"]
    assert 2 in after["listed"] and 2 not in after["complete"]  # a partial folder: no CHECKPOINT.json
    assert max(after["complete"]) == 1  # what a resume restores from
    assert after["committed"][:2] == [1, 2]


def test_enospc_fails_the_run_with_one_line_and_status_json_agrees(runs: dict[str, dict]) -> None:
    outcome = runs["enospc"]
    first = outcome["first"]
    assert first.returncode == 2, first.stderr[-3000:]
    errors = [line for line in first.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is full" in errors[0] and str(outcome["where"].lake_uri) in errors[0], first.stderr[-3000:]
    assert "the step is retried" not in first.stderr and "rlpipe resume" in first.stderr
    after = outcome["after_failure"]
    assert after["status"].state.value == "failed"
    assert errors[0].removeprefix("error:").strip() in after["status"].error
    assert max(after["complete"]) == 1 and 2 not in after["listed"]  # checkpoint 1 intact, the partial one removed
    assert after["committed"][:2] == [1, 2]


@pytest.mark.parametrize("name", ["kill", "enospc"])
def test_the_resumed_run_equals_the_uninterrupted_one(runs: dict[str, dict], name: str, tmp_path: Path) -> None:
    outcome, reference = runs[name], runs["reference"]
    assert reference["first"].returncode == 0, reference["first"].stderr[-3000:]
    assert outcome["resumed"].returncode == 0, outcome["resumed"].stderr[-3000:]
    lake, reference_lake = outcome["where"].lake(), reference["where"].lake()
    assert lake.committed_steps(outcome["run_id"]) == list(range(1, STEPS + 1))
    assert lake.read_status(outcome["run_id"]).state.value == "finished"
    assert count_rows(lake, outcome["run_id"]) == count_rows(reference_lake, reference["run_id"])
    assert rows_by_key(lake, outcome["run_id"]) == rows_by_key(reference_lake, reference["run_id"])
    weights = final_weights(lake, outcome["run_id"], STEPS, tmp_path / "resumed")
    expected = final_weights(reference_lake, reference["run_id"], STEPS, tmp_path / "reference")
    assert sorted(weights) == sorted(expected) and all(torch.equal(weights[key], expected[key]) for key in expected)
    assert lake.checkpoints.listed_steps(outcome["run_id"]) == lake.checkpoint_steps(outcome["run_id"])  # no partial folder


# the checkpoints each run ever committed: the killed or failed write of checkpoint 2 is not
# made again (its step was committed: the resume goes on after it); the ENOSPC run fails at
# checkpoint 3's save (where the failed write is reported), and its resume goes on at step 4.
# (The kill lands before step 2's evaluation, which its resume does not make either.)
EVER_COMMITTED = {"reference": [0, 1, 2, 3, 4], "kill": [0, 1, 3, 4], "enospc": [0, 1, 4]}


@pytest.mark.parametrize("name", sorted(EVER_COMMITTED))
def test_retention_keeps_exactly_what_it_promises(runs: dict[str, dict], name: str) -> None:
    """The 2 newest, the best evaluated one, nothing else (the resume target is the newest)."""
    outcome = runs[name]
    lake, run_id = outcome["where"].lake(), outcome["run_id"]
    accuracies = evaluated_accuracies(lake, run_id)
    assert {0, STEPS} <= set(accuracies) and (name == "kill" or 2 in accuracies)  # before RL, step 2, after RL
    ever = EVER_COMMITTED[name]
    best = max((accuracies[step], step) for step in ever if step in accuracies)[1]
    assert lake.checkpoints.listed_steps(run_id) == sorted({*ever[-2:], best})
    assert set(kept_reasons(lake.checkpoint_steps(run_id), STEPS, accuracies, RULE)) == {*ever[-2:], best}
