"""A checkpoint's step folder is a plain HF model folder: the final checkpoint of a run,
downloaded from the lake into a fresh process and loaded with AutoModelForCausalLM /
AutoTokenizer alone, gives the same held-out accuracy (overall and per domain) as the process
that wrote it measured after RL (stored in the lake as evals/after_rl.json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlpipe.controller.builders import build_lake
from rlpipe.flows.train import train
from tests.durability.cli_runs import REPO_ROOT
from tests.flows.runs import tiny_config

pytestmark = pytest.mark.slow

# Single-digit sums learn fast: enough warm-start for a held-out accuracy well above 0, so
# that "the same accuracy" means the same answers, not two zeros.
LEARNABLE = [
    "train.steps=2",
    "checkpoint.every_steps=2",
    "envs.domains={arithmetic = 1.0}",
    "envs.max_operand=9",
    "envs.heldout_size=20",
    "warmstart.steps=60",
    "warmstart.batch_size=32",
]


def test_final_checkpoint_reloads_in_a_fresh_process_with_the_same_heldout_accuracy(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, *LEARNABLE)
    summary = train(config, "reload")
    lake = build_lake(config)
    written = lake.read_json("reload", "evals/after_rl.json")
    assert written is not None and written["policy_version"] == 2
    folder = tmp_path / "checkpoint"
    step = lake.latest_checkpoint("reload")
    assert step == 2 and summary.final_checkpoint.endswith("step=000002")
    assert lake.load_checkpoint("reload", step, folder) is not None
    config_file = tmp_path / "config.json"
    config_file.write_text(config.model_dump_json())
    result = subprocess.run(
        [sys.executable, "-m", "tests.durability.eval_checkpoint", str(folder), str(config_file)],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reloaded = json.loads(result.stdout.strip().splitlines()[-1])
    expected = {key: value for key, value in written.items() if key.startswith("accuracy")}  # strict, overall and per domain
    assert set(reloaded) == set(expected) == {"accuracy", "accuracy/arithmetic"}
    assert reloaded == expected
    assert reloaded["accuracy"] > 0.0  # a real comparison, not two untrained zeros
