"""The background checkpoint writer holds no copy of the trainer's state: the bytes of
model.safetensors and optimizer.pt are written from the memory of the live tensors
themselves (the weights, AdamW's moments and step counts), so a checkpoint costs no second
copy of the state; and once a write is over (written or failed) the writer holds no
reference to what it wrote."""

from __future__ import annotations

import gc
import weakref
from contextlib import contextmanager
from pathlib import Path

import numpy
import pytest
import torch

from rlpipe.core.config import load_config
from rlpipe.core.errors import DiskFull
from rlpipe.rl.checkpoint import CheckpointMeta
from rlpipe.rl.checkpoint_layout import OPTIMIZER_FILE, WEIGHTS_FILE
from rlpipe.storage.checkpoint_retention import RetentionRule
from rlpipe.storage.lake import Lake
from rlpipe.workers import checkpoint_writer
from rlpipe.workers.builders import build_policy, build_trainer


def _trained():
    config = load_config(None, ["train.steps=1"])
    policy, tokenizer = build_policy(config)
    trainer = build_trainer(config, policy)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)  # moments that a checkpoint writes
    policy(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    return policy, tokenizer, {**trainer.state_dict(), "optimizer": optimizer.state_dict()}, optimizer


def _address(data) -> int | None:
    """The address of the memory a write was handed (None for an empty one)."""
    view = memoryview(data)
    return numpy.frombuffer(view.cast("B"), dtype=numpy.uint8).ctypes.data if view.nbytes else None


class _Recorder:
    """A stream that notes (address, size) of every write before passing it on."""

    def __init__(self, stream, writes: list[tuple[int, int]]) -> None:
        self._stream, self._writes = stream, writes

    def write(self, data) -> int:
        address = _address(data)
        if address is not None:
            self._writes.append((address, memoryview(data).nbytes))
        return self._stream.write(data)

    def flush(self) -> None:
        self._stream.flush()


def _recording(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[tuple[int, int]]]:
    """(address, size) of every write into each file the background writer writes."""
    writes: dict[str, list[tuple[int, int]]] = {}
    real = checkpoint_writer.write_contents

    def write(contents, open_file):
        @contextmanager
        def recorded(path: str):
            with open_file(path) as stream:
                yield _Recorder(stream, writes.setdefault(path, []))
        real(contents, recorded)

    monkeypatch.setattr(checkpoint_writer, "write_contents", write)
    return writes


def _bytes_from(writes: list[tuple[int, int]], tensors: list[torch.Tensor]) -> int:
    """How many of the written bytes came straight from the memory of `tensors`."""
    ranges = {(tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()) for tensor in tensors}
    return sum(size for address, size in writes if any(start <= address and address + size <= end for start, end in ranges))


def _untied_weights(policy) -> list[torch.Tensor]:
    return list({tensor.data_ptr(): tensor for tensor in policy.state_dict().values()}.values())


def _size(tensors: list[torch.Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def test_the_files_are_written_from_the_live_tensors_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that copied the state (a snapshot) would write none of these bytes from the
    live tensors' memory."""
    policy, tokenizer, state, optimizer = _trained()
    writes = _recording(monkeypatch)
    writer = checkpoint_writer.CheckpointWriter(Lake.open(str(tmp_path / "lake")), "r1", RetentionRule(2, 0, False))
    writer.save(policy, tokenizer, state, CheckpointMeta(1, 1, "h"), wait=True)
    weights = _untied_weights(policy)
    moments = [tensor for per_parameter in optimizer.state.values() for tensor in per_parameter.values()]
    assert len(moments) == 3 * len(list(policy.parameters()))  # exp_avg, exp_avg_sq, step
    assert _bytes_from(writes[WEIGHTS_FILE], weights) == _size(weights)
    assert _bytes_from(writes[OPTIMIZER_FILE], moments) == _size(moments)


@pytest.mark.parametrize("fail", [False, True], ids=["written", "failed"])
def test_a_written_or_failed_checkpoint_is_not_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: bool) -> None:
    policy, tokenizer, state, _ = _trained()
    held: list[weakref.ref] = []
    real = checkpoint_writer.write_contents

    def write(contents, open_file):
        held.append(weakref.ref(contents))
        if fail:
            raise DiskFull("the disk is full (test)", hint="free space")
        real(contents, open_file)

    monkeypatch.setattr(checkpoint_writer, "write_contents", write)
    writer = checkpoint_writer.CheckpointWriter(Lake.open(str(tmp_path / "lake")), "r1", RetentionRule(2, 0, False))
    writer.save(policy, tokenizer, state, CheckpointMeta(1, 1, "h"))
    writer.join()  # the trainer's wait: the failure stays for `wait`
    if fail:
        with pytest.raises(DiskFull):
            writer.wait()
    else:
        writer.wait()
    gc.collect()
    assert len(held) == 1 and held[0]() is None
