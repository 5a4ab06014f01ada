"""Save and load a policy checkpoint in a local folder: the HF model folder layout
(config.json, model.safetensors, tokenizer files) plus the trainer's optimizer state and a
small meta file. A checkpoint folder loads with plain `transformers` as a model.

Not here: where checkpoints live (storage/lake.py uploads and downloads folders).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

TRAINER_STATE_FILE = "trainer_state.pt"
META_FILE = "rlpipe_checkpoint.json"


@dataclass(frozen=True)
class CheckpointMeta:
    step: int
    policy_version: int
    config_hash: str


def save_checkpoint(folder: Path, model, tokenizer, trainer_state: dict, meta: CheckpointMeta) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    torch.save(trainer_state, folder / TRAINER_STATE_FILE)
    (folder / META_FILE).write_text(json.dumps(asdict(meta)))


def load_checkpoint(folder: Path, model) -> tuple[CheckpointMeta, dict]:
    """Load weights into `model` in place; return the meta and the trainer state."""
    state = load_file(str(folder / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings are saved once; anything else missing is a broken checkpoint.
    missing = [name for name in missing if name != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"checkpoint {folder} does not match the model: missing={missing} unexpected={unexpected}")
    if "lm_head.weight" not in state and getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    trainer_state = torch.load(folder / TRAINER_STATE_FILE, weights_only=False)
    meta = CheckpointMeta(**json.loads((folder / META_FILE).read_text()))
    return meta, trainer_state
