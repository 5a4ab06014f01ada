"""How many bytes one checkpoint of a run takes, from its config alone (no torch, no model).

    weights     parameters x bytes of model.dtype (4 float32, 2 bfloat16)
    optimizer   AdamW's two float32 moments per trained parameter (8 bytes), plus float32
                master weights (4 bytes) when the model is bfloat16; a LoRA run trains only
                its adapter (counted as 1% of the parameters)

The parameter count: a model folder's safetensors headers (exact), or its other weight
files' size / 4; a GGUF file's size at 4.5 bits per parameter (its quantization, roughly); a
tiny model's shapes (model.hidden_size, num_layers, intermediate_size, a character
vocabulary of at most 256). What it does not: count the tokenizer or config files (a few
MB at most), or check the disk (storage/disk_space.py).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from rlpipe.rl.model_folder import WEIGHT_FILES

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
TINY_VOCAB = 256
LORA_TRAINED_FRACTION = 0.01


@dataclass(frozen=True)
class CheckpointSize:
    parameters: int
    weights_bytes: int
    optimizer_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.optimizer_bytes


def checkpoint_size(config) -> CheckpointSize:
    """The estimated size of one checkpoint of a run of `config` (a RunConfig)."""
    parameters = parameter_count(config)
    dtype_bytes = 2 if config.model.dtype == "bfloat16" else 4
    trained = int(parameters * LORA_TRAINED_FRACTION) if config.train.lora_rank > 0 else parameters
    optimizer = trained * (8 + (4 if dtype_bytes == 2 else 0))
    return CheckpointSize(parameters, parameters * dtype_bytes, optimizer)


def parameter_count(config) -> int:
    model = config.model
    if model.gguf is not None:
        return int(Path(model.gguf).stat().st_size * 8 / 4.5) if Path(model.gguf).is_file() else 0
    if model.path is not None:
        return _folder_parameters(Path(model.path))
    hidden, layers, inner = model.hidden_size, model.num_layers, model.intermediate_size
    per_layer = 4 * hidden * hidden + 3 * hidden + 3 * hidden * inner + 2 * hidden  # attention (+ biases), MLP, norms
    return TINY_VOCAB * hidden + layers * per_layer + hidden


def _folder_parameters(folder: Path) -> int:
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return sum(_safetensors_parameters(path) for path in files)
    for name in WEIGHT_FILES:
        if (folder / name).is_file() and not name.endswith(".json"):
            return (folder / name).stat().st_size // 4
    return 0


def _safetensors_parameters(path: Path) -> int:
    """The elements of a safetensors file, from its header (the weights are not read); a
    header that cannot be read (a truncated or foreign file, which the worker that loads it
    will report) is sized from the file's bytes instead: this is an estimate for the disk."""
    try:
        with open(path, "rb") as stream:
            (length,) = struct.unpack("<Q", stream.read(8))
            header = json.loads(stream.read(min(length, 100 * 1024 * 1024)))
        return sum((entry["data_offsets"][1] - entry["data_offsets"][0]) // _DTYPE_BYTES.get(entry["dtype"], 4)
                   for name, entry in header.items() if name != "__metadata__")
    except (OSError, struct.error, ValueError, AttributeError, KeyError, TypeError, IndexError):
        return path.stat().st_size // 4
