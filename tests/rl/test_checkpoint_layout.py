"""The step folder is an HF model folder (from_pretrained loads it), written in one pass
from the live tensors; checkpoints of the older layout (policy/ + trainer/) still restore and
export."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlpipe.core.config import load_config
from rlpipe.rl.checkpoint import CheckpointMeta, load_checkpoint, save_checkpoint
from rlpipe.rl.checkpoint_layout import LEGACY_LAYOUT, LAYOUT, layout_of
from rlpipe.rl.checkpoint_contents import ContentsGatherer
from rlpipe.storage.lake import Lake
from rlpipe.workers.builders import build_policy, build_trainer
from rlpipe.workers.policy_export import export_policy
from rlpipe.storage.lake_records import RunInfo


def _trained(seed: int = 0):
    config = load_config(None, ["train.steps=1", f"seed={seed}"])
    policy, tokenizer = build_policy(config)
    return config, policy, tokenizer, build_trainer(config, policy)


def test_from_pretrained_loads_the_step_folder_itself(tmp_path: Path) -> None:
    _, policy, tokenizer, trainer = _trained()
    save_checkpoint(tmp_path, trainer.model, tokenizer, trainer.state_dict(), CheckpointMeta(3, 3, "h"))
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded("12+7=")["input_ids"] == tokenizer("12+7=")["input_ids"]
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in policy.state_dict().items())
    assert layout_of(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*")) == LAYOUT


def test_the_contents_are_the_live_tensors_with_a_tied_one_once(tmp_path: Path) -> None:
    _, policy, tokenizer, trainer = _trained()
    contents = ContentsGatherer().gather(trainer.model, tokenizer, trainer.state_dict(), CheckpointMeta(1, 1, "h"))
    live = list(dict.fromkeys(tensor.data_ptr() for tensor in policy.state_dict().values()))  # a tied one once
    assert [tensor.data_ptr() for _, tensor in contents.weights] == live


def test_an_old_layout_checkpoint_restores_and_exports(tmp_path: Path) -> None:
    config, policy, tokenizer, trainer = _trained()
    written = tmp_path / "new"
    save_checkpoint(written, trainer.model, tokenizer, trainer.state_dict(), CheckpointMeta(2, 2, "h"))
    old = tmp_path / "old"  # what rlpipe wrote before: the model in policy/, the rest in trainer/
    for path in written.iterdir():
        inside = LEGACY_LAYOUT.trainer_dir if path.name in ("optimizer.pt", "rlpipe_checkpoint.json") else LEGACY_LAYOUT.policy_dir
        (old / inside).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, old / inside / path.name)
    _, other, _, _ = _trained(seed=5)
    meta, state = load_checkpoint(old, other)
    assert meta == CheckpointMeta(2, 2, "h") and "param_groups" in state
    assert all(torch.equal(other.state_dict()[name], tensor) for name, tensor in policy.state_dict().items())
    lake = Lake.open(str(tmp_path / "lake"))
    lake.write_run_info(RunInfo("old", config.model_dump_json(), "h", "test", 0))
    lake.save_checkpoint("old", 2, old)
    exported = export_policy(lake, "old", tmp_path / "export")
    assert "model.safetensors" in exported.files and "optimizer.pt" not in exported.files
    weights = load_file(str(tmp_path / "export" / "model.safetensors"))
    assert torch.equal(weights["model.embed_tokens.weight"], policy.state_dict()["model.embed_tokens.weight"])
    AutoModelForCausalLM.from_pretrained(tmp_path / "export")
