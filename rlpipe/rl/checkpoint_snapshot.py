"""A checkpoint as a snapshot in host memory, and the writing of its files as streams.

`SnapshotTaker.take` copies what a checkpoint holds (the policy's weights, a LoRA policy's
merged weights and adapter, the trainer's state) into host-memory tensors, so that training
can go on while another thread writes them: the snapshot never changes after `take`. Its
buffers are the taker's until `release` (workers/checkpoint_writer.py releases them once the
snapshot is written: held for the whole run, they were one more copy of the weights and the
AdamW state in the trainer's memory between checkpoints, 3x the fp32 weights); a snapshot
must be written before the next one is taken (the writer keeps at most one in flight). The small files (config.json, generation_config.json, the
tokenizer's, adapter_config.json) are rendered once per taker by transformers and peft
themselves and kept as bytes.

`write_snapshot` writes the folder of rl/checkpoint_layout.py file by file through an
`open_file(relative_path)` context manager that the caller provides (a local folder, or a
lake's checkpoint folder: storage/checkpoint_store.py), so the bytes go once, straight to
where they stay. model.safetensors is streamed tensor by tensor in safetensors' own format
(a header, then the raw bytes: what `safetensors.torch.save_file` writes, with the
`{"format": "pt"}` metadata transformers requires); a tensor that shares its storage with an
earlier one (tied embeddings) is written once, as `save_pretrained` does. optimizer.pt is
`torch.save` of the trainer state into the stream.

What it does not: decide where files go, digest them or commit a checkpoint (the caller's
`open_file` and storage/), or load checkpoints (rl/checkpoint.py).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch
from peft import get_peft_model_state_dict

from rlpipe.rl.checkpoint_layout import ADAPTER_DIR, META_FILE, OPTIMIZER_FILE, WEIGHTS_FILE
from rlpipe.rl.lora import has_lora_layers, is_lora_model, merged_copy

OpenFile = Callable[[str], AbstractContextManager[BinaryIO]]
_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}
_STREAM_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class CheckpointMeta:
    step: int
    policy_version: int
    config_hash: str


@dataclass
class CheckpointSnapshot:
    """What one checkpoint writes, frozen in host memory at `take`."""

    meta: CheckpointMeta
    weights: list[tuple[str, torch.Tensor]]  # the model's tensors, a tied one only once
    trainer_state: dict[str, Any]
    adapter: list[tuple[str, torch.Tensor]] | None  # a LoRA policy's adapter tensors
    small_files: dict[str, bytes] = field(default_factory=dict)  # path -> bytes

    @property
    def size_bytes(self) -> int:
        tensors = [tensor for _, tensor in self.weights + (self.adapter or [])] + list(_tensors_of(self.trainer_state))
        return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


class SnapshotTaker:
    """Takes snapshots into buffers that it reuses from one snapshot to the next."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._small_files: dict[str, bytes] | None = None

    def take(self, model, tokenizer, trainer_state: dict[str, Any], meta: CheckpointMeta) -> CheckpointSnapshot:
        """Copy the model's weights (merged for a LoRA model), its adapter and the trainer
        state into host memory."""
        if has_lora_layers(model) and not is_lora_model(model):
            raise ValueError("a checkpoint got the base model of a LoRA policy; pass the peft model "
                             "(Trainer.model) so that it holds the merged weights and adapter/ the adapter")
        adapter = None
        if is_lora_model(model):
            merged = merged_copy(model)  # a fresh copy already: no buffer needed
            weights = _untied(merged.state_dict(), lambda name, tensor: tensor.detach().to("cpu"))
            adapter = _untied(get_peft_model_state_dict(model), lambda name, tensor: self._copy(f"adapter/{name}", tensor))
            small_source = merged
        else:
            weights = _untied(model.state_dict(), lambda name, tensor: self._copy(f"weights/{name}", tensor))
            small_source = model
        state = self._copy_tree("trainer", trainer_state)
        if self._small_files is None:
            self._small_files = _small_files(small_source, tokenizer, model if adapter is not None else None)
        files = {**self._small_files, META_FILE: json.dumps(asdict(meta)).encode()}
        return CheckpointSnapshot(meta=meta, weights=weights, trainer_state=state, adapter=adapter, small_files=files)

    def release(self) -> None:
        """Drop the buffers (a snapshot that still holds them keeps them alive until it goes)."""
        self._buffers = {}

    def _copy(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
            self._buffers[key] = buffer
        buffer.copy_(tensor.detach())
        return buffer

    def _copy_tree(self, key: str, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self._copy(key, value)
        if isinstance(value, dict):
            return {name: self._copy_tree(f"{key}/{name}", item) for name, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._copy_tree(f"{key}/{index}", item) for index, item in enumerate(value))
        return value


def write_snapshot(snapshot: CheckpointSnapshot, open_file: OpenFile) -> None:
    """Write the files of the checkpoint folder through `open_file` (see the module docstring);
    model.safetensors and optimizer.pt are streamed, never built whole in memory."""
    for path, data in sorted(snapshot.small_files.items()):
        if path == META_FILE:
            continue  # last of all: a folder with it has every other file
        with open_file(path) as stream:
            stream.write(data)
    with open_file(WEIGHTS_FILE) as stream:
        write_safetensors(snapshot.weights, stream)
    if snapshot.adapter is not None:
        with open_file(f"{ADAPTER_DIR}/adapter_model.safetensors") as stream:
            write_safetensors(snapshot.adapter, stream)
    with open_file(OPTIMIZER_FILE) as stream:
        torch.save(snapshot.trainer_state, stream)
    with open_file(META_FILE) as stream:
        stream.write(snapshot.small_files[META_FILE])


def write_safetensors(tensors: list[tuple[str, torch.Tensor]], stream: BinaryIO) -> None:
    """Stream `tensors` in the safetensors format (header, then each tensor's bytes)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in tensors:
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-aligned, as safetensors pads it
    stream.write(len(encoded).to_bytes(8, "little"))
    stream.write(encoded)
    for _, tensor in tensors:
        for chunk in _byte_chunks(tensor):
            stream.write(chunk)


def _byte_chunks(tensor: torch.Tensor) -> Iterator[memoryview]:
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return
    data = memoryview(flat.view(torch.uint8).numpy())
    for start in range(0, len(data), _STREAM_BYTES):
        yield data[start:start + _STREAM_BYTES]


def _untied(state: dict[str, torch.Tensor], copy: Callable[[str, torch.Tensor], torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """(name, copy) of each tensor, skipping one whose storage an earlier tensor shares."""
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    result = []
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        result.append((name, copy(name, tensor)))
    return result


def _tensors_of(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_of(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_of(item)


def _small_files(model, tokenizer, peft_model) -> dict[str, bytes]:
    """config.json, generation_config.json and the tokenizer's files as transformers writes
    them (and a LoRA policy's adapter_config.json as peft writes it), read back as bytes."""
    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="rlpipe-ckpt-") as folder:
        model.save_pretrained(folder, state_dict={}, safe_serialization=True)  # no tensors: config files only
        tokenizer.save_pretrained(folder)
        if peft_model is not None:
            peft_model.save_pretrained(str(Path(folder, ADAPTER_DIR)), safe_serialization=True)  # small: the adapter
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file() and path.suffix != ".safetensors":
                files[path.relative_to(folder).as_posix()] = path.read_bytes()
    return files
