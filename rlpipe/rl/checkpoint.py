"""Save and load a policy checkpoint in a local folder, in two sub-folders:

    policy/    a plain HF model folder: config.json, generation_config.json,
               model.safetensors, tokenizer.json, tokenizer_config.json. Nothing else, so
               `AutoModelForCausalLM` / `AutoTokenizer` / `pipeline` load it as is.
    trainer/   what only rlpipe needs to go on training: optimizer.pt (the AdamW state, and
               the fp32 master weights of a bf16 policy) and rlpipe_checkpoint.json (step,
               policy version, config hash).

A LoRA policy (a peft model, rl/lora.py) is saved as: policy/ = the MERGED model (base +
adapter, a plain HF folder that loads without peft), and trainer/adapter/ = the adapter in
peft's own layout (adapter_config.json, adapter_model.safetensors: `PeftModel.from_pretrained`
or vLLM's LoRA loader read it). Loading a LoRA checkpoint puts the adapter back into the peft
model and leaves its base as it is: the base comes from the run's model source (a seeded tiny
model or model.path), the same on every restore; the merged weights are never loaded back
(base + adapter cannot be split again exactly).

Loading executes nothing from the folder: weights come from safetensors, the optimizer
state through `torch.load(weights_only=True)` (tensors and plain containers only), the meta
from JSON. A trainer file that holds anything else (a pickle that would import or call code)
is refused with LakeCorrupted naming the file: a checkpoint written by rlpipe never does,
so someone altered it (digests do not help when the writer of the bucket rewrites
CHECKPOINT.json too).

Not here: where checkpoints live (storage/lake.py uploads and downloads folders).
"""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from peft import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors import SafetensorError
from safetensors.torch import load_file

from rlpipe.core.errors import LakeCorrupted
from rlpipe.rl.checkpoint_layout import (  # noqa: F401 - re-exported
    ADAPTER_DIR,
    ADAPTER_FILE,
    META_FILE,
    OPTIMIZER_FILE,
    POLICY_DIR,
    TRAINER_DIR,
    WEIGHTS_FILE,
)
from rlpipe.rl.lora import has_lora_layers, is_lora_model, merged_copy



@dataclass(frozen=True)
class CheckpointMeta:
    step: int
    policy_version: int
    config_hash: str


def save_checkpoint(folder: Path, model, tokenizer, trainer_state: dict, meta: CheckpointMeta) -> None:
    """Write policy/ (HF layout) and trainer/ (optimizer state, meta) under `folder`; a LoRA
    model writes its merged weights to policy/ and its adapter to trainer/adapter/."""
    if has_lora_layers(model) and not is_lora_model(model):
        raise ValueError("save_checkpoint got the base model of a LoRA policy; pass the peft model "
                         "(Trainer.model) so that policy/ holds the merged weights and trainer/adapter/ the adapter")
    (folder / TRAINER_DIR).mkdir(parents=True, exist_ok=True)
    if is_lora_model(model):
        model.save_pretrained(folder / ADAPTER_DIR, safe_serialization=True)
        merged_copy(model).save_pretrained(folder / POLICY_DIR, safe_serialization=True)
    else:
        model.save_pretrained(folder / POLICY_DIR, safe_serialization=True)
    tokenizer.save_pretrained(folder / POLICY_DIR)
    torch.save(trainer_state, folder / OPTIMIZER_FILE)
    (folder / META_FILE).write_text(json.dumps(asdict(meta)))


def load_policy_weights(folder: Path, model) -> None:
    """Load policy/model.safetensors of a checkpoint folder into `model` in place (a LoRA
    model: trainer/adapter/ into its adapter, see the module docstring)."""
    if is_lora_model(model):
        load_adapter(folder, model)
        return
    state = load_file(str(folder / WEIGHTS_FILE))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings are saved once; anything else missing is a broken checkpoint.
    missing = [name for name in missing if name != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"checkpoint {folder} does not match the model: missing={missing} unexpected={unexpected}")
    if "lm_head.weight" not in state and getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()


def load_adapter(folder: Path, model) -> None:
    """Load trainer/adapter/adapter_model.safetensors into a peft model's adapter, exactly;
    ValueError when the checkpoint has no adapter or another one (rank, target modules)."""
    path = folder / ADAPTER_FILE
    if not path.is_file():
        raise ValueError(f"checkpoint {folder} has no LoRA adapter ({ADAPTER_FILE}) but the policy is a LoRA model; "
                         "was it written with train.lora_rank = 0?")
    try:
        state = load_file(str(path))
    except SafetensorError as exc:
        raise LakeCorrupted(f"checkpoint file {path} is not a readable safetensors file: {exc}",
                            hint="delete this checkpoint folder (an older one is used)") from exc
    expected = get_peft_model_state_dict(model)
    if state.keys() != expected.keys() or any(state[name].shape != expected[name].shape for name in state):
        raise ValueError(f"the LoRA adapter of checkpoint {folder} does not match the model "
                         f"({len(state)} tensors, the model's adapter has {len(expected)}, or other shapes); "
                         "was it written with other train.lora_rank / lora_target_modules?")
    result = set_peft_model_state_dict(model, state)
    if result.unexpected_keys:
        raise ValueError(f"checkpoint {folder}: adapter tensors the model does not have: {result.unexpected_keys[:3]}")


def load_checkpoint(folder: Path, model, source: str = "") -> tuple[CheckpointMeta, dict]:
    """Load weights into `model` in place; return the meta and the trainer state. `source`
    (where the folder came from, e.g. the lake's checkpoint URI) names files in errors.

    The trainer state is read before the weights, so a refused checkpoint leaves `model`
    untouched (the caller may fall back to an older one)."""
    trainer_state = load_trainer_state(folder / OPTIMIZER_FILE, f"{(source or str(folder)).rstrip('/')}/{OPTIMIZER_FILE}")
    meta = CheckpointMeta(**json.loads((folder / META_FILE).read_text()))
    load_policy_weights(folder, model)
    return meta, trainer_state


def load_trainer_state(path: Path, name: str) -> dict:
    """The optimizer state, unpickled with torch's weights-only loader (no code runs);
    `name` is how errors call the file."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        # torch's message is a page of advice (load it unsafely); keep only what it found
        found = re.search(r"WeightsUnpickler error: ([^\n.]+)", str(exc))
        what = found.group(1).strip() if found else ""
        raise LakeCorrupted(
            f"checkpoint file {name} holds objects other than tensors and plain containers"
            f"{f' ({what})' if what else ''}; refused to unpickle it",
            hint="rlpipe never writes such a file: someone altered the checkpoint. Delete this "
            "checkpoint folder (an older one is used) and check who can write the lake",
        ) from exc
