"""What a local model folder must hold (config, weights, tokenizer), checked with pathlib only.

Kept apart from rl/policy.py (which imports torch and transformers) so that the controller's
pre-flight (controller/model_checks.py) can refuse a missing or incomplete folder without importing
either. What it does not: read the files (model_checks reads config.json and tokenizer.json;
rl/policy.py loads the model)."""

from __future__ import annotations

from pathlib import Path

from rlpipe.core.errors import ModelNotFoundError

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
FOLDER_HINT = (
    "pass a folder written by model.save_pretrained() and tokenizer.save_pretrained(), "
    "or leave model.path unset to build a tiny model"
)


def check_model_folder(path: str | Path) -> Path:
    """Raise ModelNotFoundError unless `path` holds a config, weights and a tokenizer."""
    folder = Path(path)
    if not folder.is_dir():
        raise ModelNotFoundError(f"model folder not found: {folder}", FOLDER_HINT)
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"model folder {folder} has no config.json", FOLDER_HINT)
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ModelNotFoundError(f"model folder {folder} has no weights ({', '.join(WEIGHT_FILES)})", FOLDER_HINT)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelNotFoundError(f"model folder {folder} has no tokenizer (tokenizer.json)", FOLDER_HINT)
    return folder
