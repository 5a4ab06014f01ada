"""Weight files on /dev/shm (tmpfs: memory, no disk): a whole version in one file, or a
stream of bounded chunks.

Chunks (the synchronous sync, workers/weight_stream.py): `plan_chunks` splits the trainer's
weights (the trainer model's named_parameters, or only the LoRA adapter's: whatever
`Trainer.named_weights()` yields) into pieces of rows (dim 0) and packs them into chunks of at
most `chunk_bytes` each (a single row larger than that is a chunk of its own).
`write_chunk` writes one chunk as a safetensors file whose metadata gives each piece's first
row; `load_chunk` reads a chunk's pieces straight into the engine's parameter rows (no
buffer when the dtype matches) and deletes the file. So the memory a sync adds is one chunk
file on /dev/shm, never a second copy of the model.

Whole files (async runs, controller/weight_sync.py): `publish` writes every tensor into one
file that must outlive the trainer's next updates; the engine worker loads it with
`load_into` (safetensors' `safe_open`, one tensor at a time).

Every file is written to a temporary name and renamed, so a reader never sees half a file,
straight from the tensors' memory (no serialized copy of them in the trainer). The bytes are
copied as they are: the engine gets the trainer's exact weights (same dtype, bit for bit).

Not here: when to sync (tasks/), the order of the calls (workers/weight_stream.py), or how
an engine puts whole tensors in place (engines/).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64", torch.int64: "I64",
           torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
_FROM_NAME = {name: dtype for dtype, name in _DTYPES.items()}
FIRST_ROWS_KEY = "first_rows"  # metadata: JSON {name: first row of the piece in its parameter}


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) of weight `name` (a 0-dim tensor is one row)."""

    name: str
    start: int
    stop: int


def rows_of(tensor: torch.Tensor) -> int:
    """Rows along dim 0, the unit a stream splits weights by (a 0-dim tensor is one row)."""
    return tensor.shape[0] if tensor.dim() else 1


def _piece_tensor(tensor: torch.Tensor, piece: Piece) -> torch.Tensor:
    tensor = tensor.detach()
    return tensor.narrow(0, piece.start, piece.stop - piece.start) if tensor.dim() else tensor


def plan_chunks(named_tensors: Iterable[tuple[str, torch.Tensor]], chunk_bytes: int) -> list[list[Piece]]:
    """The weights as chunks of pieces, in order, each chunk at most `chunk_bytes` (but at least one row)."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
    chunks: list[list[Piece]] = [[]]
    used = 0
    for name, tensor in named_tensors:
        rows = rows_of(tensor)
        row_bytes = tensor.numel() * tensor.element_size() // max(rows, 1)
        per_piece = max(1, chunk_bytes // max(row_bytes, 1))
        for start in range(0, max(rows, 1), per_piece):
            piece = Piece(name, start, min(rows, start + per_piece))
            size = (piece.stop - piece.start) * row_bytes
            if chunks[-1] and used + size > chunk_bytes:
                chunks.append([])
                used = 0
            chunks[-1].append(piece)
            used += size
    return [chunk for chunk in chunks if chunk]


def _write(path: Path, tensors: list[tuple[str, torch.Tensor]], metadata: dict[str, str]) -> int:
    """A safetensors file at `path` (via a temporary name), each tensor's bytes written from
    its own memory; returns its size."""
    header: dict[str, object] = {"__metadata__": metadata}
    offset, views = 0, []
    for name, tensor in tensors:
        if tensor.dtype not in _DTYPES:
            raise ValueError(f"weight {name!r} has dtype {tensor.dtype}, which a weight file does not carry")
        data = tensor.detach().to("cpu").contiguous().reshape(-1)
        size = data.numel() * data.element_size()
        header[name] = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
        if size:
            views.append(data.view(torch.uint8).numpy())
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as out:
        out.write(len(encoded).to_bytes(8, "little"))
        out.write(encoded)
        for view in views:
            out.write(memoryview(view))
    os.replace(partial, path)
    return 8 + len(encoded) + offset


def write_chunk(named_tensors: Iterable[tuple[str, torch.Tensor]], chunk: list[Piece], path: Path, policy_version: int) -> int:
    """Write one chunk of `plan_chunks` (its pieces taken from `named_tensors`); returns its size."""
    weights = dict(named_tensors)
    tensors = [(piece.name, _piece_tensor(weights[piece.name], piece)) for piece in chunk]
    first_rows = json.dumps({piece.name: piece.start for piece in chunk})
    return _write(path, tensors, {"policy_version": str(policy_version), FIRST_ROWS_KEY: first_rows})


def load_chunk(path: str | Path, rows_view) -> list[tuple[str, int, int]]:  # noqa: ANN001 - (name, first_row, shape) -> Tensor
    """Read each piece of a chunk file into `rows_view(name, first_row, shape)` (the engine's
    parameter rows, written in place: straight from the file when dtype and layout match, else
    through a piece-sized buffer cast by copy_), then delete the file; returns the pieces as
    (name, first row, rows)."""
    loaded = []
    with open(path, "rb") as chunk:
        size = int.from_bytes(chunk.read(8), "little")
        header = json.loads(chunk.read(size))
        first_rows = json.loads(header.pop("__metadata__")[FIRST_ROWS_KEY])
        for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
            start, stop = entry["data_offsets"]
            shape, dtype = tuple(entry["shape"]), _FROM_NAME[entry["dtype"]]
            target = rows_view(name, int(first_rows[name]), shape)
            direct = target.dtype == dtype and target.device.type == "cpu" and target.is_contiguous()
            buffer = target if direct else torch.empty(shape, dtype=dtype)
            chunk.seek(8 + size + start)
            if stop > start and chunk.readinto(memoryview(buffer.reshape(-1).view(torch.uint8).numpy())) != stop - start:
                raise OSError(f"weight chunk {path} ends inside {name!r}: a truncated file")
            if not direct:
                target.copy_(buffer.to(target.device, target.dtype))
            loaded.append((name, int(first_rows[name]), rows_of(buffer)))
    Path(path).unlink(missing_ok=True)
    return loaded


def publish(named_tensors: Iterable[tuple[str, torch.Tensor]], folder: Path, policy_version: int) -> tuple[Path, int]:
    """Write the tensors as one safetensors file in `folder`; returns (path, bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"weights-v{policy_version:06d}-{os.getpid()}-{os.urandom(4).hex()}.safetensors"
    size = _write(final, list(named_tensors), {"policy_version": str(policy_version)})
    return final, size


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
