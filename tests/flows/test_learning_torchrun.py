"""The small end-to-end run of tests/flows/test_learning_e2e.py with the trainer's update
under torchrun (cluster.trainer_nproc = 2: two gloo ranks on loopback): it learns by the same
margin, stores every row once, and leaves no torchrun or rank process behind.

Why the same assertion holds: two ranks compute the one-process update up to float rounding
(tests/workers/test_trainer_group.py), and the learning test's margin was set against
exactly that kind of difference (another thread count, another reduction order: another
trajectory), so it asserts the effect on 1000 held-out words, never one trajectory's
numbers. The warm-start runs on rank 0 alone and is copied to rank 1 before the first
update, so this also checks that copy: ranks that drifted apart would not learn together.
Its gains on three seeds are in docs/RESULTS.md ("The learning tests' gains"); MIN_GAIN is 3.

Marked `extended` (`make test-extended`, not CI): its property follows from two checks CI
runs, the two-rank update equal to one process's (test_trainer_group.py) and the one-process
run learning (test_learning_e2e.py), and it cost CI ~110 s of a worker's time (a slow 2-core
machine). Run it after changing the trainer group or the learning recipe.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.flows.test_learning_e2e import train_and_check_it_learned
from rlpipe.workers.launch import SHARED_ZYGOTE_ENV_VAR
from tests.helpers.processes import processes_marked
from tests.workers.workers_at_hand import wait_until_gone

MARK = "RLPIPE_TEST_TORCHRUN_RUN"


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(1800)  # ~200 s at load 5: above the suite's 600 s hang guard at a high load
def test_small_quickstart_learns_with_two_trainer_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MARK, str(tmp_path))  # inherited by the workers, torchrun and its ranks
    monkeypatch.delenv(SHARED_ZYGOTE_ENV_VAR, raising=False)  # a zygote that has the marker too
    train_and_check_it_learned(tmp_path, "learn-ddp", "cluster.trainer_nproc=2")

    # The run ended: its trainer worker stopped the group (no orphaned rank or torchrun).
    assert wait_until_gone(processes_marked(MARK, str(tmp_path)), timeout_s=30) == []
