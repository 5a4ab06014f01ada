"""Nothing executable from the lake: whoever can write the bucket must not run code in the
trainer. A checkpoint whose optimizer file holds a pickle that would call a function (here
Path.write_text of a marker file) is refused with LakeCorrupted naming the file, the marker
is never written, and a resume falls back to an older checkpoint, or fails naming the file
when none is left. The attacker is assumed to rewrite CHECKPOINT.json too, so the digests
match and only the loader stands in the way."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest
import torch

from rlpipe.controller.builders import build_lake
from rlpipe.core.errors import LakeCorrupted
from rlpipe.flows.train import train
from rlpipe.rl.checkpoint import OPTIMIZER_FILE, CheckpointMeta, load_checkpoint, save_checkpoint
from rlpipe.storage.lake import Lake
from rlpipe.storage.digests import new_hasher
from rlpipe.storage.lake_records import CheckpointFile, CheckpointInfo
from rlpipe.workers.builders import build_policy, build_trainer
from tests.flows.runs import tiny_config


class WritesMarker:
    """Unpickling this calls Path.write_text(marker, ...): code from the file runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return Path.write_text, (self.marker, "code from a checkpoint ran")


def _poison_bytes(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save({"state": {0: WritesMarker(marker)}, "param_groups": []}, buffer)
    return buffer.getvalue()


def _digest(algorithm: str, data: bytes) -> str:
    hasher = new_hasher(algorithm)
    hasher.update(data)
    return hasher.hexdigest()


def _poison_in_lake(lake: Lake, run_id: str, step: int, marker: Path) -> None:
    """Replace the checkpoint's optimizer file and rewrite CHECKPOINT.json to match it."""
    base = f"checkpoints/{run_id}/step={step:06d}"
    data = _poison_bytes(marker)
    lake.objects.put(f"{base}/{OPTIMIZER_FILE}", data)
    info = CheckpointInfo.from_json(lake.objects.get(f"{base}/CHECKPOINT.json").decode())
    files = tuple(
        CheckpointFile.of(file.path, len(data), file.digest[0], _digest(file.digest[0], data))
        if file.path == OPTIMIZER_FILE else file
        for file in info.files
    )
    assert files != info.files, f"{OPTIMIZER_FILE} is not listed in {base}/CHECKPOINT.json"
    lake.objects.put(f"{base}/CHECKPOINT.json", dataclasses.replace(info, files=files).to_json().encode())


def test_the_poison_would_run_code_if_unpickled_unsafely(tmp_path: Path) -> None:
    """The test's pickle is a real threat: the old loader (weights_only=False) runs it."""
    marker = tmp_path / "marker"
    path = tmp_path / "optimizer.pt"
    path.write_bytes(_poison_bytes(marker))
    torch.load(path, weights_only=False)
    assert marker.read_text() == "code from a checkpoint ran"


def test_a_checkpoint_whose_optimizer_file_would_run_code_is_refused(tmp_path: Path) -> None:
    config = tiny_config(tmp_path)
    policy, tokenizer = build_policy(config)
    folder = tmp_path / "checkpoint"
    save_checkpoint(folder, policy, tokenizer, build_trainer(config, policy).state_dict(), CheckpointMeta(0, 0, "h"))
    marker = tmp_path / "marker"
    (folder / OPTIMIZER_FILE).write_bytes(_poison_bytes(marker))
    before = {name: tensor.clone() for name, tensor in policy.state_dict().items()}
    with pytest.raises(LakeCorrupted, match=r"s3://lake/checkpoints/r/step=000000/optimizer\.pt holds objects") as caught:
        load_checkpoint(folder, policy, source="s3://lake/checkpoints/r/step=000000")
    assert "Unsupported global" in caught.value.message  # what torch found, not its page of advice
    assert "altered" in caught.value.hint
    assert not marker.exists()
    assert all(torch.equal(before[name], tensor) for name, tensor in policy.state_dict().items())  # untouched


@pytest.mark.slow
def test_resume_falls_back_from_a_poisoned_checkpoint_or_fails_naming_the_file(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, "checkpoint.every_steps=2")  # checkpoints 0, 2 and 3 (final)
    train(config, "poisoned")
    lake = build_lake(config)
    marker = tmp_path / "marker"
    # the newest checkpoint is poisoned: refused, the resume loads checkpoint 2, replays step 3
    _poison_in_lake(lake, "poisoned", 3, marker)
    summary = train(config, "poisoned")
    assert summary.steps_committed == 3
    assert lake.read_status("poisoned").state.value == "finished"
    assert not marker.exists()
    # every checkpoint poisoned: nothing to fall back to, the resume fails naming the file
    _poison_in_lake(lake, "poisoned", 2, marker)
    _poison_in_lake(lake, "poisoned", 0, marker)
    with pytest.raises(LakeCorrupted, match=r"checkpoints/poisoned/step=000000/optimizer\.pt"):
        train(config, "poisoned")
    assert not marker.exists()
