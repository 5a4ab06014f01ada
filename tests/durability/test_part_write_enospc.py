"""A disk that fills while a step's trajectory part is written.

The real CLI in subprocesses, 4 steps of the small config (a checkpoint every 2 steps), two
runs side by side:
  - reference: uninterrupted;
  - enospc: ENOSPC injected at step 3's part write (core/failpoints.py `part-write@3:enospc`:
    the Parquet part half written), then `rlpipe resume` once "space is freed" (no failpoint).
The failed run must print one error line naming the full disk (no traceback, no "retried"),
record the run as failed in status.json with that line, and leave steps 1-2 and checkpoint 2
as they were, with no half-written part in the lake; the resumed run must end with exactly
the reference's rows and final weights.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.durability.cli_runs import (
    SMALL_TOML,
    cli_env,
    count_rows,
    final_weights,
    make_where,
    rows_by_key,
    run_cli,
)

pytestmark = pytest.mark.slow

STEPS = 4
FAILED_STEP = 3  # one part per step: the 3rd part write is step 3's
TOML = SMALL_TOML.replace("steps = 5\n[rollout]", f"steps = {STEPS}\n[rollout]")


def _run(root: Path, api: str, name: str, failpoints: str | None) -> dict:
    where = make_where(root / name, toml=TOML)
    run_id = f"part-{name}"
    first = run_cli(["train", str(where.config_path), "--run-id", run_id], cli_env(where, api, failpoints), where.folder)
    outcome: dict = {"where": where, "run_id": run_id, "first": first}
    if failpoints is None:
        return outcome
    lake = where.lake()
    lake_files = [path for path in Path(where.lake_uri).rglob("*") if path.is_file()]
    outcome["after_failure"] = {
        "committed": lake.committed_steps(run_id), "complete": lake.checkpoint_steps(run_id),
        "status": lake.read_status(run_id), "rows": count_rows(lake, run_id), "rows_by_key": rows_by_key(lake, run_id),
        "partial_files": [path for path in lake_files if path.name.endswith(".partial")],
        "failed_step_parts": [path for path in lake_files if "trajectories" in path.parts and f"step={FAILED_STEP}" in path.parts],
    }
    outcome["resumed"] = run_cli(["resume", run_id, "--lake", where.lake_uri], cli_env(where, api), where.folder)
    return outcome


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, prefect_api_url: str) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("part-write-enospc")
    specs = {"reference": None, "enospc": f"part-write@{FAILED_STEP}:enospc"}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(_run, root, prefect_api_url, name, spec) for name, spec in specs.items()}
        return {name: future.result() for name, future in futures.items()}


def test_enospc_at_a_part_write_fails_the_run_with_one_line(runs: dict[str, dict]) -> None:
    outcome = runs["enospc"]
    first = outcome["first"]
    assert first.returncode == 2, first.stderr[-3000:]
    errors = [line for line in first.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is full" in errors[0] and str(outcome["where"].lake_uri) in errors[0], first.stderr[-3000:]
    assert "Traceback" not in first.stderr and "the step is retried" not in first.stderr
    assert "rlpipe resume" in first.stderr
    status = outcome["after_failure"]["status"]
    assert status.state.value == "failed"
    assert errors[0].removeprefix("error:").strip() in status.error


def test_enospc_at_a_part_write_loses_nothing_committed(runs: dict[str, dict]) -> None:
    after, reference = runs["enospc"]["after_failure"], runs["reference"]
    assert reference["first"].returncode == 0, reference["first"].stderr[-3000:]
    assert after["committed"] == list(range(1, FAILED_STEP))
    assert max(after["complete"]) == FAILED_STEP - 1  # what the resume restores from
    assert after["partial_files"] == [] and after["failed_step_parts"] == []  # the half-written part is gone
    reference_rows = rows_by_key(reference["where"].lake(), reference["run_id"])
    committed = {key: value for key, value in reference_rows.items() if key[0] < FAILED_STEP}
    assert after["rows_by_key"] == committed  # the committed steps' rows, exactly


def test_the_resumed_run_equals_the_uninterrupted_one(runs: dict[str, dict], tmp_path: Path) -> None:
    outcome, reference = runs["enospc"], runs["reference"]
    assert outcome["resumed"].returncode == 0, outcome["resumed"].stderr[-3000:]
    lake, reference_lake = outcome["where"].lake(), reference["where"].lake()
    assert lake.committed_steps(outcome["run_id"]) == list(range(1, STEPS + 1))
    assert lake.read_status(outcome["run_id"]).state.value == "finished"
    assert count_rows(lake, outcome["run_id"]) == count_rows(reference_lake, reference["run_id"])
    assert rows_by_key(lake, outcome["run_id"]) == rows_by_key(reference_lake, reference["run_id"])
    weights = final_weights(lake, outcome["run_id"], STEPS, tmp_path / "resumed")
    expected = final_weights(reference_lake, reference["run_id"], STEPS, tmp_path / "reference")
    assert sorted(weights) == sorted(expected) and all(torch.equal(weights[key], expected[key]) for key in expected)
