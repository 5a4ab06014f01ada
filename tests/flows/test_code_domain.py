"""The code domain in the train flow: a tiny run whose every row is verified in a
bubblewrap sandbox of the run's pool (the verify stage fans out over `SandboxPool.map`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpipe.core.records import VerdictReason
from rlpipe.envs.code import CodeEnv
from rlpipe.flows.train import train
from rlpipe.storage.query import query_trajectories
from rlpipe.tasks.builders import build_lake
from tests.flows.runs import tiny_config
from tests.sandbox._bwrap_support import require_bwrap

pytestmark = pytest.mark.bwrap

# What the code verifier can say about a completion; sandbox_error (reward None) is not in it.
CODE_REASONS = {VerdictReason.OK, VerdictReason.WRONG, VerdictReason.FORMAT, VerdictReason.CRASH,
                VerdictReason.TIMEOUT, VerdictReason.OOM}


def test_tiny_code_run_verifies_every_row_in_the_sandbox(tmp_path: Path) -> None:
    require_bwrap()
    config = tiny_config(
        tmp_path,
        "envs.domains={code = 1.0}",
        'sandbox.backend="bwrap"',
        "sandbox.timeout_s=5.0",
        "sandbox.pool_size=2",
        "train.steps=2",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=6",
        "warmstart.steps=1",
        "warmstart.batch_size=2",
        "envs.heldout_size=2",
        "model.max_position_embeddings=2048",  # HumanEval prompts run to ~1,400 characters
    )
    summary = train(config.model_dump_json(), "code")
    lake = build_lake(config)
    assert summary.steps_committed == 2
    assert lake.read_status("code").state.value == "finished"
    rows = query_trajectories(
        lake, "select domain, reason, reward, verifier_version from trajectories order by step, task_id, sample_idx"
    ).rows
    assert len(rows) == 2 * 2 * 2  # steps x prompts x samples
    version = CodeEnv(timeout_s=5.0).verifier_version
    for domain, reason, reward, verifier_version in rows:
        assert domain == "code"
        assert VerdictReason(reason) in CODE_REASONS, reason
        assert reward in (0.0, 1.0)
        assert verifier_version == version
    assert lake.read_json("code", "evals/after_rl.json")["accuracy/code"] in (0.0, 0.5, 1.0)
