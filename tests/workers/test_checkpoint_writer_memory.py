"""The background checkpoint writer holds no copy of the trainer's state once a checkpoint is
written: the snapshot's tensors (weights and AdamW moments, 3x the fp32 weights) are freed,
whether the write succeeded or failed, and the next checkpoint is still exact."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlpipe.core.config import load_config
from rlpipe.core.errors import DiskFull
from rlpipe.rl.checkpoint import CheckpointMeta
from rlpipe.rl.checkpoint_layout import WEIGHTS_FILE
from rlpipe.storage.checkpoint_retention import RetentionRule
from rlpipe.storage.lake import Lake
from rlpipe.workers import checkpoint_writer
from rlpipe.workers.builders import build_policy, build_trainer


def _trained():
    config = load_config(None, ["train.steps=1"])
    policy, tokenizer = build_policy(config)
    trainer = build_trainer(config, policy)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)  # moments that a checkpoint snapshots
    policy(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    return policy, tokenizer, {**trainer.state_dict(), "optimizer": optimizer.state_dict()}


def _watching(monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> list[weakref.ref]:
    """Weak references to every tensor of each snapshot the writer writes."""
    refs: list[weakref.ref] = []
    real = checkpoint_writer.write_snapshot

    def write(snapshot, open_file):
        refs.extend(weakref.ref(tensor) for _, tensor in snapshot.weights)
        refs.extend(weakref.ref(tensor) for tensor in snapshot.trainer_state["optimizer"]["state"][0].values()
                    if isinstance(tensor, torch.Tensor) and tensor.dim() > 0)
        if fail:
            raise DiskFull("the disk is full (test)", hint="free space")
        real(snapshot, open_file)

    monkeypatch.setattr(checkpoint_writer, "write_snapshot", write)
    return refs


@pytest.mark.parametrize("fail", [False, True], ids=["written", "failed"])
def test_a_written_or_failed_snapshot_is_freed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: bool) -> None:
    policy, tokenizer, state = _trained()
    refs = _watching(monkeypatch, fail)
    writer = checkpoint_writer.CheckpointWriter(Lake.open(str(tmp_path / "lake")), "r1", RetentionRule(2, 0, False))
    writer.save(policy, tokenizer, state, CheckpointMeta(1, 1, "h"))
    if fail:
        with pytest.raises(DiskFull):
            writer.wait()
    else:
        writer.wait()
    gc.collect()
    assert len(refs) > len(list(policy.parameters())) and all(ref() is None for ref in refs)


def test_the_next_checkpoint_after_a_freed_one_is_exact(tmp_path: Path) -> None:
    policy, tokenizer, state = _trained()
    lake = Lake.open(str(tmp_path / "lake"))
    writer = checkpoint_writer.CheckpointWriter(lake, "r1", RetentionRule(2, 0, False))
    writer.save(policy, tokenizer, state, CheckpointMeta(1, 1, "h"), wait=True)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.5)
    writer.save(policy, tokenizer, state, CheckpointMeta(2, 2, "h"))
    expected = {name: parameter.detach().clone() for name, parameter in policy.named_parameters()}
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(1.0)  # training goes on while checkpoint 2 is written
    writer.wait()
    assert lake.load_checkpoint("r1", 2, tmp_path / "two") is not None
    saved = load_file(str(tmp_path / "two" / WEIGHTS_FILE))
    assert expected.keys() & saved.keys() and all(torch.equal(saved[name], expected[name]) for name in expected.keys() & saved.keys())
