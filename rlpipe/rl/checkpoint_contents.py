"""What a checkpoint holds, gathered as references to the live tensors, and the writing of
its files as streams.

`gather_contents` collects what a checkpoint writes (the policy's weights, a LoRA policy's
merged weights and adapter, the trainer's state) WITHOUT copying it: the contents hold the
trainer's own tensors (the parameters, AdamW's moments and step counts, a bf16 policy's
fp32 masters), so a checkpoint costs no second copy of the state in memory. The price is a
rule for the caller: nothing may change those tensors in place until the files are written
(workers/checkpoint_writer.py writes them in a background thread; the trainer's
`before_state_change` hook, rl/trainer.py, waits for that write before each optimizer step
and every other change of the weights or optimizer state). A LoRA policy's merged weights
are a fresh model (rl/lora.py `merged_copy`), the one copy a LoRA checkpoint makes. The
small files (config.json, generation_config.json, the tokenizer's, adapter_config.json) are
rendered once per `ContentsGatherer` by transformers and peft themselves and kept as bytes.

`write_contents` writes the folder of rl/checkpoint_layout.py file by file through an
`open_file(relative_path)` context manager that the caller provides (a local folder, or a
lake's checkpoint folder: storage/checkpoint_store.py), so the bytes go once, straight from
the tensors' memory to where they stay. model.safetensors is streamed tensor by tensor in
safetensors' own format (a header, then the raw bytes: what `safetensors.torch.save_file`
writes, with the `{"format": "pt"}` metadata transformers requires); a tensor that shares
its storage with an earlier one (tied embeddings) is written once, as `save_pretrained`
does. optimizer.pt is `torch.save` of the trainer state into the stream (torch hands the
stream each storage's own memory), without the zip records' CRC-32 (torch's
`save.compute_crc32`; ~12% of a write's CPU): every file's bytes are digested (xxh3_128) by
the caller and checked at load, and `torch.load` reads the file the same.

What it does not: decide where files go, digest them or commit a checkpoint (the caller's
`open_file` and storage/), keep the tensors still while they are written (the caller), or
load checkpoints (rl/checkpoint.py).
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
import torch.utils.serialization
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
class CheckpointContents:
    """What one checkpoint writes: references to the live tensors (see the module docstring)."""

    meta: CheckpointMeta
    weights: list[tuple[str, torch.Tensor]]  # the model's tensors, a tied one only once
    trainer_state: dict[str, Any]
    adapter: list[tuple[str, torch.Tensor]] | None  # a LoRA policy's adapter tensors
    small_files: dict[str, bytes] = field(default_factory=dict)  # path -> bytes

    @property
    def size_bytes(self) -> int:
        tensors = [tensor for _, tensor in self.weights + (self.adapter or [])] + list(_tensors_of(self.trainer_state))
        return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


class ContentsGatherer:
    """Gathers checkpoint contents; renders the small files once and keeps them."""

    def __init__(self) -> None:
        self._small_files: dict[str, bytes] | None = None

    def gather(self, model, tokenizer, trainer_state: dict[str, Any], meta: CheckpointMeta) -> CheckpointContents:
        """The model's weights (merged for a LoRA model), its adapter and the trainer state,
        as the live tensors themselves (detached, on their device; no copy but a LoRA
        policy's merged weights)."""
        if has_lora_layers(model) and not is_lora_model(model):
            raise ValueError("a checkpoint got the base model of a LoRA policy; pass the peft model "
                             "(Trainer.model) so that it holds the merged weights and adapter/ the adapter")
        adapter = None
        if is_lora_model(model):
            merged = merged_copy(model)  # a fresh model: nothing else changes it
            weights = _untied(merged.state_dict())
            adapter = _untied(get_peft_model_state_dict(model))
            small_source = merged
        else:
            weights = _untied(model.state_dict())
            small_source = model
        if self._small_files is None:
            self._small_files = _small_files(small_source, tokenizer, model if adapter is not None else None)
        files = {**self._small_files, META_FILE: json.dumps(asdict(meta)).encode()}
        return CheckpointContents(meta=meta, weights=weights, trainer_state=trainer_state, adapter=adapter, small_files=files)


def write_contents(contents: CheckpointContents, open_file: OpenFile) -> None:
    """Write the files of the checkpoint folder through `open_file` (see the module docstring);
    model.safetensors and optimizer.pt are streamed, never built whole in memory."""
    for path, data in sorted(contents.small_files.items()):
        if path == META_FILE:
            continue  # last of all: a folder with it has every other file
        with open_file(path) as stream:
            stream.write(data)
    with open_file(WEIGHTS_FILE) as stream:
        write_safetensors(contents.weights, stream)
    if contents.adapter is not None:
        with open_file(f"{ADAPTER_DIR}/adapter_model.safetensors") as stream:
            write_safetensors(contents.adapter, stream)
    with open_file(OPTIMIZER_FILE) as stream, _without_zip_crc():
        torch.save(contents.trainer_state, stream)
    with open_file(META_FILE) as stream:
        stream.write(contents.small_files[META_FILE])


def _without_zip_crc() -> AbstractContextManager:
    """torch.save skips the CRC-32 of its zip records while this is open (a process-wide
    setting of torch's; optimizer.pt is the only file a trainer saves with torch.save)."""
    return torch.utils.serialization.config.patch({"save.compute_crc32": False})


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
    """The tensor's own bytes (a CPU tensor's memory itself; a GPU tensor's through a host
    copy of that one tensor)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return
    data = memoryview(flat.view(torch.uint8).numpy())
    for start in range(0, len(data), _STREAM_BYTES):
        yield data[start:start + _STREAM_BYTES]


def _untied(state: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """(name, detached tensor) of each tensor, skipping one whose storage an earlier tensor shares."""
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    result = []
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        result.append((name, tensor.detach()))
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
