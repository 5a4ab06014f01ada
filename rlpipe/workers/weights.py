"""Weight sync through one safetensors file on /dev/shm (tmpfs: memory, no disk).

The trainer worker writes its weights (the trainer model's named_parameters, or only the
LoRA adapter's: whatever `Trainer.named_weights()` yields) into the run's weights folder as
one file, written to a temporary name and renamed, so a reader never sees half a file. The
engine worker opens it with safetensors' `safe_open` (mmap: the bytes are read once, from
memory) and hands the tensors to `engine.load_weights(named_tensors, version)`; the
controller deletes the file once the engine acknowledged the version. The bytes are copied
as they are: the engine gets the trainer's exact weights (same dtype, bit for bit).

Not here: when to sync (tasks/update.py), or how an engine puts tensors in place.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file



def publish(named_tensors: Iterable[tuple[str, torch.Tensor]], folder: Path, policy_version: int) -> tuple[Path, int]:
    """Write the tensors as one safetensors file in `folder`; returns (path, bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in named_tensors}
    final = folder / f"weights-v{policy_version:06d}-{os.getpid()}-{os.urandom(4).hex()}.safetensors"
    partial = final.with_suffix(".partial")
    save_file(tensors, str(partial), metadata={"policy_version": str(policy_version)})
    os.replace(partial, final)
    return final, final.stat().st_size


def load_into(engine, path: str | Path, policy_version: int) -> int:  # noqa: ANN001 - a RolloutEngine
    """Hand the file's tensors to `engine.load_weights`; returns the version it now serves."""
    with safe_open(str(path), framework="pt", device="cpu") as weights:
        engine.load_weights(((name, weights.get_tensor(name)) for name in weights.keys()), policy_version)
    return engine.policy_version


def digest(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over every (name, dtype, shape, bytes), in name order."""
    hasher = hashlib.sha256()
    for name, tensor in sorted(named_tensors, key=lambda item: item[0]):
        data = tensor.detach().to("cpu").contiguous()
        hasher.update(f"{name}|{data.dtype}|{tuple(data.shape)}|".encode())
        hasher.update(data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return hasher.hexdigest()
