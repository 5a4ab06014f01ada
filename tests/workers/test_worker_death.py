"""A worker that dies is replaced by the next call: one killed between calls is restarted
by the call itself; one killed during a call makes that call raise EngineFailed (retried by
Prefect) and the next call starts a fresh one. A whole run whose engine worker and trainer
worker are each killed mid-run (SIGKILL at a crash point) ends with exactly the rows and
the final weights of an undisturbed run: the trainer comes back from the lake (checkpoint +
replay), the engine by a sync; Prefect shows each death as a second attempt of the stage it
hit (a call to a dead worker, engine or trainer, raises EngineFailed: an InfraError, retried)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
import torch

from rlpipe.controller.builders import build_lake
from rlpipe.core.errors import EngineFailed
from rlpipe.engines.sampling import SamplingParams
from rlpipe.flows.train import train
from rlpipe.storage.query import query_trajectories
from tests.durability.cli_runs import final_weights
from tests.flows.runs import tiny_config
from tests.helpers.prefect_runs import step_stage_runs
from tests.workers.workers_at_hand import engine_worker, wait_until_gone

PARAMS = SamplingParams(n=2, max_new_tokens=4, seed=3)
PROMPTS = [("t", "5+5=")]


def test_a_worker_killed_between_calls_is_restarted_by_the_next_call(tmp_path: Path) -> None:
    with engine_worker(tmp_path) as engine:
        first = engine.generate(PROMPTS, PARAMS)
        old_pid = engine.pid
        os.kill(old_pid, signal.SIGKILL)
        assert wait_until_gone([old_pid]) == []
        again = engine.generate(PROMPTS, PARAMS)  # a fresh worker, the same initial weights
        assert engine.pid != old_pid and engine.starts == 2
        assert again.completions == first.completions


def test_a_call_sent_to_a_worker_being_killed_goes_to_a_fresh_one(tmp_path: Path) -> None:
    """No wait after the kill: the process may still exist when the request is sent, but it
    never reads it (no Accepted comes back), so the client sends it again to a fresh worker."""
    with engine_worker(tmp_path) as engine:
        first = engine.generate(PROMPTS, PARAMS)
        old_pid = engine.pid
        os.kill(old_pid, signal.SIGKILL)
        again = engine.generate(PROMPTS, PARAMS)
        assert engine.pid != old_pid and engine.starts == 2
        assert again.completions == first.completions


def test_a_worker_killed_during_a_call_raises_engine_failed_and_the_next_call_starts_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLPIPE_FAILPOINTS", "engine-generate@1")  # the worker SIGKILLs itself in its 1st generate
    with engine_worker(tmp_path) as engine:
        with pytest.raises(EngineFailed, match="died during Generate") as caught:
            engine.generate(PROMPTS, PARAMS)
        assert "exit code -9" in caught.value.message
        result = engine.generate(PROMPTS, PARAMS)  # a fresh worker, started without the crash point
        assert len(result.completions) == 2 and engine.starts == 2


STEPS_CONFIG = ["train.steps=4", "checkpoint.every_steps=2"]


@pytest.mark.slow
def test_a_run_whose_workers_are_killed_mid_run_equals_an_undisturbed_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_api_url: str
) -> None:
    reference_config = tiny_config(tmp_path / "reference", *STEPS_CONFIG)
    train(reference_config, "undisturbed")
    # The engine worker dies in its 4th generate (evaluate(before_rl), steps 1 and 2, then
    # step 3's rollouts): the retry's fresh engine gets the trainer's weights (version 2).
    # The trainer worker dies in its 4th update (step 4, weights half changed): its fresh
    # successor loads checkpoint 2 and replays step 3 from the lake, then the retry applies 4.
    monkeypatch.setenv("RLPIPE_FAILPOINTS", "trainer-update@4,engine-generate@4")
    config = tiny_config(tmp_path / "killed", *STEPS_CONFIG)
    summary = train(config, "killed")
    assert summary.steps_committed == 4
    lake, reference_lake = build_lake(config), build_lake(reference_config)
    rows = "select step, task_id, sample_idx, completion_text, reward, advantage from trajectories order by all"
    assert query_trajectories(lake, rows).rows == query_trajectories(reference_lake, rows).rows
    assert len(query_trajectories(lake, rows).rows) == 4 * 4 * 4  # 4 steps x 4 prompts x 4 samples
    weights = final_weights(lake, "killed", 4, tmp_path / "w1")
    expected = final_weights(reference_lake, "undisturbed", 4, tmp_path / "w2")
    assert sorted(weights) == sorted(expected)
    assert [name for name in expected if not torch.equal(weights[name], expected[name])] == []
    # Prefect: the task runs of steps 3 and 4 each took two attempts (the death, then the retry
    # with a fresh worker; step 4's retry finds its rows committed and goes on to the update);
    # the undisturbed run's took one.
    (step_3,) = asyncio.run(step_stage_runs("killed", 3))  # one flow run: no resume
    (step_4,) = asyncio.run(step_stage_runs("killed", 4))
    assert step_3["step"] == [("Completed", 2)] and step_4["step"] == [("Completed", 2)], (step_3, step_4)
    (undisturbed,) = asyncio.run(step_stage_runs("undisturbed", 3))
    assert undisturbed["step"] == [("Completed", 1)], undisturbed
