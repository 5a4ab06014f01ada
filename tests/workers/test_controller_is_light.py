"""The controller (the CLI and the flow's process) holds no model: importing the CLI and the
train flow, and the pre-flight of a run with the tiny model or with a model folder (its
config.json and tokenizer.json), load neither torch nor
transformers, peft, safetensors or vllm. Those live in the workers (DESIGN.md, process
model); each CLI start and each resume skips their import time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "transformers", "peft", "safetensors", "vllm", "accelerate")
REPO_ROOT = Path(__file__).resolve().parents[2]


def _model_folder(folder: Path) -> Path:
    """What the pre-flight reads of a model folder: config.json and the tokenizer as
    save_pretrained writes it (the weights file must exist; it is not read before the workers
    load it). This test process may import torch; the pre-flight runs in a subprocess."""
    import json

    from rlpipe.rl.policy import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": len(tokenizer), "max_position_embeddings": 64}))
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def test_cli_flow_and_preflight_import_no_model_library(tmp_path: Path) -> None:
    folder = _model_folder(tmp_path / "model")
    code = f"""
import sys
import rlpipe.cli.main, rlpipe.flows.train
from rlpipe.controller.preflight import preflight
from rlpipe.core.config import load_config
preflight(load_config({str(REPO_ROOT / 'configs/quickstart.toml')!r}, ["storage.lake_uri={tmp_path / 'lake'}"]))
preflight(load_config(None, ["storage.lake_uri={tmp_path / 'lake2'}", 'model.path="{folder}"']))
print(sorted(name for name in {HEAVY!r} if name in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
