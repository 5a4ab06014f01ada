"""kill -9 at five moments of a run, then resume: the finished run equals an uninterrupted one.

Runs the real CLI (`python -m rlpipe.cli.main train CONFIG --run-id X`) in subprocesses. The
reference run is uninterrupted; each scenario arms one failpoint (core/failpoints.py: the
process SIGKILLs itself there), checks that the run died with -9 and that queries see only
committed steps, then `rlpipe resume X --lake ...` to completion. The finished run must have:
exactly the reference's rows (count, keys, completion texts, rewards, advantages), no duplicate
key, no orphan counted by the query, a manifest for every step, final weights bit-equal to the
reference's, and MLflow histories with one point per step.

Config: 5 steps, checkpoints every 2 steps (0, 2, 4, final 5). Kills land in step 4, so the
resume loads checkpoint 2 and replays step 3 (and step 4 where it was committed) from the lake.
(`warmstart`, a kill inside the very first checkpoint whose resume redoes the warm start,
was dropped for CI time: a half-written checkpoint is `checkpoint-write`'s case, and a run
stopped in its warm start and resumed from nothing is tests/cli/test_signals.py's.)
`part-write` also alters checkpoint 2 before its resume (bit rot), which falls back to
checkpoint 0 and replays steps 1-3, and still takes step 4's generated rows from the lake,
where the killed run staged them (tasks/step_tasks.py; its domains verify inline, and rows
verified inline are not staged: the resume verifies them again); `update` and
`checkpoint-write` resume from checkpoint 2 itself. (A kill inside `generate` of step 4, before
anything of the step is staged, was a scenario of its own until CI's time ran short: its
resume computes step 4 with nothing staged, as `lost-files`' resume does once the staged
rows are gone; tests/workers/test_worker_death.py still kills the engine worker inside a
generate mid-run. A kill in step 4's verify is `lost-files`' point, and the bit rot of a
checkpoint is `part-write`'s.)
`lost-files` kills in `verify` of step 4 and deletes checkpoint 2's weights file and the
staged rows of step 4 before its resume: the resume falls back to checkpoint 0 and computes
step 4's stages again.

The curriculum is on (two domains; ratios move half-way to their target each step, over a
window of 2 steps; arithmetic on operands 0..4 after 80 warm-start steps has reward to
find, reverse has none yet, so the ratios move), so every resume must also draw each
step's tasks by the ratios the killed run would have drawn by: they come from the committed
steps' rewards in the lake.

All runs of the module go in one fixture, three processes at a time (each with its own lake,
MLflow store and Prefect home, all reporting to the session's Prefect server).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterName,
    LogFilter,
    LogFilterFlowRunId,
)

from rlpipe.cli.runs import run_report
from rlpipe.rl.checkpoint import WEIGHTS_FILE
from rlpipe.storage.lake import Lake
from tests.durability.cli_runs import (
    SMALL_ROWS,
    SMALL_STEPS,
    SMALL_TOML,
    Where,
    checkpoint_file_count,
    cli_env,
    count_rows,
    final_weights,
    make_where,
    rows_by_key,
    run_cli,
)
from tests.helpers.prefect_runs import step_stage_runs

pytestmark = pytest.mark.slow

# The curriculum on, with a domain that has reward to find (sums of operands 0..4 after 80
# warm-start steps) beside one that has none yet (reverse), so the ratios move.
KR_TOML = (SMALL_TOML.replace("[warmstart]\nsteps = 5\n", "[warmstart]\nsteps = 80\n").replace("[envs]\n", "[envs]\nmax_operand = 4\n")
           + "[curriculum]\nenabled = true\nrate = 0.5\nwindow = 2\n")
# name -> (failpoint spec, the step the kill lands in, steps committed when it dies)
# checkpoint-write's hit count is filled in from the reference: files per checkpoint.
SCENARIOS: dict[str, tuple[str, int, list[int]]] = {
    "update": ("update@4", 4, [1, 2, 3, 4]),
    "part-write": ("part-write@4", 4, [1, 2, 3]),
    "checkpoint-write": ("checkpoint-write@{mid_checkpoint_4}", 4, [1, 2, 3, 4]),
    "lost-files": ("verify@4", 4, [1, 2, 3]),
}
# scenario -> the checkpoint whose weights file is altered in the lake before the resume: the
# resume finds it LakeCorrupted, falls back to checkpoint 0 and replays steps 1-3 instead
CORRUPT_BEFORE_RESUME = {"part-write": 2}
# scenario -> (checkpoint whose weights file is deleted, step whose staged rows are deleted)
# before the resume: a lake that lost files, not one that cannot be reached
LOST_BEFORE_RESUME = {"lost-files": (2, 4)}
METRIC_KEYS = ("reward/mean", "train/loss", "train/grad_norm", "time/generate_s")
# Stage timings are measured by the live step only: a step killed after its commit (in update,
# or in its checkpoint) is replayed without them, so they may miss that step (never doubled).
EVERY_STEP_KEYS = ("reward/mean", "train/loss", "train/grad_norm")


@dataclass
class Outcome:
    run_id: str
    where: Where
    seconds: dict[str, float] = field(default_factory=dict)
    killed: object = None  # CompletedProcess of the killed run
    rows_after_kill: tuple[int, int] | None = None
    committed_after_kill: list[int] | None = None
    status_after_kill: object = None
    shown_after_kill: str = ""  # `runs show`'s state line
    resumed: object = None


def _run_reference(root: Path, api: str) -> Outcome:
    where = make_where(root / "reference", toml=KR_TOML)
    outcome = Outcome("kr-reference", where)
    started = time.monotonic()
    result = run_cli(["train", str(where.config_path), "--run-id", outcome.run_id], cli_env(where, api), where.folder)
    outcome.seconds["train"] = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    return outcome


def _run_scenario(root: Path, api: str, name: str, failpoints: str) -> Outcome:
    where = make_where(root / name, toml=KR_TOML)
    outcome = Outcome(f"kr-{name}", where)
    started = time.monotonic()
    outcome.killed = run_cli(
        ["train", str(where.config_path), "--run-id", outcome.run_id], cli_env(where, api, failpoints), where.folder
    )
    outcome.seconds["killed_run"] = time.monotonic() - started
    lake = where.lake()
    outcome.committed_after_kill = lake.committed_steps(outcome.run_id)
    outcome.rows_after_kill = count_rows(lake, outcome.run_id)
    outcome.status_after_kill = lake.read_status(outcome.run_id)
    outcome.shown_after_kill = run_report(lake, outcome.run_id)["state_detail"]
    if name in CORRUPT_BEFORE_RESUME:
        path = f"checkpoints/{outcome.run_id}/step={CORRUPT_BEFORE_RESUME[name]:06d}/{WEIGHTS_FILE}"
        lake.objects.put(path, b"bit rot")
    if name in LOST_BEFORE_RESUME:
        checkpoint, step = LOST_BEFORE_RESUME[name]
        Path(where.lake_uri, f"checkpoints/{outcome.run_id}/step={checkpoint:06d}/{WEIGHTS_FILE}").unlink()
        staged = Path(where.lake_uri, f"staging/run_id={outcome.run_id}/step={step}")
        assert [path.name for path in staged.iterdir()], "the killed run staged generate's rows"
        shutil.rmtree(staged)
    started = time.monotonic()
    outcome.resumed = run_cli(
        ["resume", outcome.run_id, "--lake", where.lake_uri], cli_env(where, api), where.folder
    )
    outcome.seconds["resume"] = time.monotonic() - started
    return outcome


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, prefect_api_url: str) -> dict[str, Outcome]:
    root = tmp_path_factory.mktemp("kill-resume")
    # the 2nd file upload of checkpoint 4: hits 1..N are checkpoint 0, N+1..2N checkpoint 2
    files = checkpoint_file_count(root / "probe")
    specs = {name: spec.format(mid_checkpoint_4=2 * files + 2) for name, (spec, _, _) in SCENARIOS.items()}
    with ThreadPoolExecutor(max_workers=3) as pool:
        reference = pool.submit(_run_reference, root, prefect_api_url)
        futures = {name: pool.submit(_run_scenario, root, prefect_api_url, name, spec) for name, spec in specs.items()}
        outcomes = {name: future.result() for name, future in futures.items()}
        outcomes["reference"] = reference.result()
    for name, outcome in outcomes.items():
        print(f"{name:18s} " + "  ".join(f"{k} {v:5.1f}s" for k, v in outcome.seconds.items()))
    return outcomes


def test_reference_run_is_complete(runs: dict[str, Outcome]) -> None:
    reference = runs["reference"]
    lake = reference.where.lake()
    assert lake.committed_steps(reference.run_id) == list(range(1, SMALL_STEPS + 1))
    assert count_rows(lake, reference.run_id) == (SMALL_ROWS, SMALL_ROWS)
    assert lake.read_status(reference.run_id).state.value == "finished"


def _step_ratios(outcome: Outcome) -> dict[int, dict[str, float]]:
    """Each step's curriculum ratios, as its TRAIN.json in the lake records them."""
    lake = outcome.where.lake()
    ratios = {}
    for step in range(1, SMALL_STEPS + 1):
        train = lake.read_train_metrics(outcome.run_id, step)
        assert train is not None, f"step {step} has no TRAIN.json"
        ratios[step] = {key: value for key, value in dict(train.metrics).items() if key.startswith("curriculum/ratio/")}
    return ratios


def test_the_curriculum_moves_the_ratios_and_every_resume_draws_by_the_same(runs: dict[str, Outcome]) -> None:
    """Not a vacuous curriculum: the reference's ratios leave the configured 50/50. The resumed
    runs' rows equal the reference's (test_resumed_run_equals_the_uninterrupted_run), and
    each step they record the reference's ratios."""
    reference = _step_ratios(runs["reference"])
    assert set(reference[1]) == {"curriculum/ratio/arithmetic", "curriculum/ratio/reverse"}
    assert any(abs(ratios["curriculum/ratio/reverse"] - 0.5) > 0.01 for ratios in reference.values()), reference
    for name in SCENARIOS:
        assert _step_ratios(runs[name]) == reference, name


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_killed_run_dies_by_sigkill_and_queries_see_only_committed_steps(runs: dict[str, Outcome], name: str) -> None:
    outcome = runs[name]
    _, step, committed = SCENARIOS[name]
    assert outcome.killed.returncode == -9, outcome.killed.stderr[-3000:]
    # checkpoint 4 is written in the background (workers/checkpoint_writer.py): step 5 may have
    # begun, or even committed, before the kill landed in its 2nd file
    steps = (step, step + 1) if name == "checkpoint-write" else (step,)
    if name == "checkpoint-write" and outcome.committed_after_kill == committed + [5]:
        committed = committed + [5]
    assert outcome.committed_after_kill == committed
    # 16 rows per committed step; a half-written or unlisted part is never counted
    assert outcome.rows_after_kill == (16 * len(committed), 16 * len(committed))
    status = outcome.status_after_kill
    assert status is not None and status.state.value == "running"  # SIGKILL leaves no chance to say more
    assert status.step in steps
    # ... but no process holds the run any more: `runs show` says it stopped (storage/run_lock.py)
    assert outcome.shown_after_kill.startswith(f"stopped at step {status.step} in stage "), outcome.shown_after_kill


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_resumed_run_equals_the_uninterrupted_run(runs: dict[str, Outcome], name: str, tmp_path: Path) -> None:
    outcome, reference = runs[name], runs["reference"]
    assert outcome.resumed.returncode == 0, outcome.resumed.stderr[-3000:]
    lake, reference_lake = outcome.where.lake(), reference.where.lake()
    # a committed manifest for every step, the run finished
    assert lake.committed_steps(outcome.run_id) == list(range(1, SMALL_STEPS + 1))
    assert lake.read_status(outcome.run_id).state.value == "finished"
    # exactly the reference's rows: count, no duplicate key, same texts, rewards, advantages
    assert count_rows(lake, outcome.run_id) == (SMALL_ROWS, SMALL_ROWS)
    assert rows_by_key(lake, outcome.run_id) == rows_by_key(reference_lake, reference.run_id)
    # every part a `*.parquet` glob finds under trajectories/ (or set_apart/) is listed by a
    # manifest: no orphan part (a write killed half-way leaves only a hidden .tmp-*.partial file)
    listed = {part.path for part in lake.committed_parts(outcome.run_id)}
    on_disk = {
        str(path.relative_to(outcome.where.lake_uri))
        for folder in ("trajectories", "set_apart") for path in Path(outcome.where.lake_uri, folder).rglob("*.parquet")
    }
    assert on_disk == listed
    leftovers = [p.name for p in Path(outcome.where.lake_uri, "trajectories").rglob("*") if p.is_file() and str(p.relative_to(outcome.where.lake_uri)) not in listed]
    assert all(name.startswith(".tmp-") and name.endswith(".partial") for name in leftovers), leftovers
    # final weights bit-equal to the reference's
    weights = final_weights(lake, outcome.run_id, SMALL_STEPS, tmp_path / "resumed")
    expected = final_weights(reference_lake, reference.run_id, SMALL_STEPS, tmp_path / "reference")
    assert sorted(weights) == sorted(expected)
    unequal = [name for name in expected if not torch.equal(weights[name], expected[name])]
    assert unequal == [], f"tensors differ from the uninterrupted run: {unequal}"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_resumed_run_logs_one_mlflow_point_per_step(runs: dict[str, Outcome], name: str) -> None:
    outcome, reference = runs[name], runs["reference"]
    assert outcome.resumed.returncode == 0, outcome.resumed.stderr[-3000:]
    ours = _mlflow_histories(outcome)
    theirs = _mlflow_histories(reference)
    for key in EVERY_STEP_KEYS:
        assert [step for step, _ in ours[key]] == list(range(1, SMALL_STEPS + 1)), (key, ours[key])
    timed = [step for step, _ in ours["time/generate_s"]]
    assert len(timed) == len(set(timed)) and set(timed) >= {1, 2, 3, 5}, timed
    # the same rewards, losses and gradient norms as the uninterrupted run, step by step
    for key in ("reward/mean", "train/loss", "train/grad_norm"):
        assert ours[key] == theirs[key], key


def test_resume_takes_generated_rows_from_the_lake(runs: dict[str, Outcome]) -> None:
    """Killed half-way through writing step 4's trajectory part, checkpoint 2 bit-rotted
    before the resume: the resume falls back to checkpoint 0, replays steps 1-3 to the same
    weights, and the resumed flow run's step 4 takes generate's rows from the lake,
    where the killed run staged them under their stage key (run id, incarnation, step, stage,
    config hash, policy version), not a new sample. Verify's are not staged (both domains
    check inline): the resume verifies them again, and the rows equal the reference's."""
    outcome = runs["part-write"]
    assert outcome.resumed.returncode == 0, outcome.resumed.stderr[-3000:]
    warnings = asyncio.run(_flow_run_log_messages(outcome.run_id))
    assert any("checkpoint 2 of run kr-part-write is corrupted" in message and message.endswith("falling back to checkpoint 0")
               for message in warnings), warnings
    states = asyncio.run(_stage_states(outcome.run_id, 4))
    # two flow runs of the run: the killed one (left Running: SIGKILL) and the resumed one
    assert len(states) == 2, states
    killed, resumed = states
    # it died inside step-4 (in persist); task runs reach the API in the background, so
    # SIGKILL may have swallowed its Running state or, on a loaded machine, its record itself
    assert killed.get("step", []) in ([], ["Pending"], ["Running"]), killed
    assert resumed["step"] == ["Completed"], resumed
    assert _reused(warnings, 4) == ["generate"], warnings


def test_lost_files_fall_back_to_an_intact_checkpoint_and_recompute_staged_rows(runs: dict[str, Outcome]) -> None:
    """`lost-files`: checkpoint 2 lacks its weights file and step 4's staged rows are gone. The
    resume loads checkpoint 0 instead (no minute of retries) and computes step 4's stages
    again (same seeds). That it ends with exactly the reference's rows and weights is
    checked by the tests above."""
    outcome = runs["lost-files"]
    assert outcome.resumed.returncode == 0, outcome.resumed.stderr[-3000:]
    warnings = asyncio.run(_flow_run_log_messages(outcome.run_id))
    assert any("checkpoint 2 of run kr-lost-files is corrupted" in message and "lacks model.safetensors" in message
               and message.endswith("falling back to checkpoint 0") for message in warnings), warnings
    killed, resumed = asyncio.run(_stage_states(outcome.run_id, 4))
    assert resumed["step"] == ["Completed"], resumed
    assert _reused(warnings, 4) == [], warnings  # nothing staged left: generated and verified again


def _reused(messages: list[str], step: int) -> list[str]:
    """The stages of `step` whose staged rows a rollout took from the lake (orchestration/stage_options.py `staged_rows`)."""
    prefix = f"step {step}: "
    return [message.removeprefix(prefix).split("'s rows were staged")[0] for message in messages
            if message.startswith(prefix) and "'s rows were staged by an earlier attempt" in message]


async def _flow_run_log_messages(flow_run_name: str) -> list[str]:
    """The messages Prefect holds for every flow run of that name (the run's own flow runs)."""
    async with get_client() as client:
        flow_runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[flow_run_name])))
        logs = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id for flow_run in flow_runs]))
        )
        return [log.message for log in logs]


async def _stage_states(run_id: str, step: int) -> list[dict[str, list[str]]]:
    """Per flow run of the run (oldest first): stage -> state names of `step`'s task runs."""
    return [{stage: [state for state, _ in runs] for stage, runs in stages.items()}
            for stages in await step_stage_runs(run_id, step)]


def _mlflow_histories(outcome: Outcome) -> dict[str, list[tuple[int, float]]]:
    lake: Lake = outcome.where.lake()
    info = lake.read_run_info(outcome.run_id)
    client = MlflowClient(tracking_uri=f"sqlite:///{outcome.where.folder / 'mlflow.db'}")
    return {
        key: sorted((point.step, point.value) for point in client.get_metric_history(info.mlflow_run_id, key))
        for key in METRIC_KEYS
    }
