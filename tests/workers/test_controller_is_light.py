"""The controller (the CLI and the flow's process) holds no model: importing the CLI and the
train flow, and the pre-flight of a run with the tiny model, load neither torch nor
transformers, peft, safetensors or vllm. Those live in the workers (DESIGN.md, process
model); each CLI start and each resume skips their import time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "transformers", "peft", "safetensors", "vllm", "accelerate")
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_cli_flow_and_preflight_import_no_model_library(tmp_path: Path) -> None:
    code = f"""
import sys
import rlpipe.cli.main, rlpipe.flows.train
from rlpipe.core.config import load_config
from rlpipe.tasks.runtime import preflight
preflight(load_config({str(REPO_ROOT / 'configs/quickstart.toml')!r}, ["storage.lake_uri={tmp_path / 'lake'}"]))
print(sorted(name for name in {HEAVY!r} if name in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
