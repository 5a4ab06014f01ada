"""Save and load a policy checkpoint in a local folder, in Hugging Face Trainer's layout
(rl/checkpoint_layout.py): the folder itself is a plain HF model folder (config.json,
generation_config.json, model.safetensors, the tokenizer files) that `AutoModelForCausalLM` /
`AutoTokenizer` / `pipeline` load as is, and beside the model files what only rlpipe needs to
go on training: optimizer.pt (the AdamW state, and the fp32 master weights of a bf16 policy)
and rlpipe_checkpoint.json (step, policy version, config hash). Folders of the older layout
(policy/ + trainer/) load too.

A LoRA policy (a peft model, rl/lora.py) is saved as: the model files = the MERGED model
(base + adapter, loads without peft), and adapter/ = the adapter in peft's own layout
(adapter_config.json, adapter_model.safetensors: `PeftModel.from_pretrained` or vLLM's LoRA
loader read it). Loading a LoRA checkpoint puts the adapter back into the peft model and
leaves its base as it is: the base comes from the run's model source (a seeded tiny model or
model.path), the same on every restore; the merged weights are never loaded back (base +
adapter cannot be split again exactly).

Loading executes nothing from the folder: weights come from safetensors, the optimizer
state through `torch.load(weights_only=True)` (tensors and plain containers only), the meta
from JSON. A trainer file that holds anything else (a pickle that would import or call code)
is refused with LakeCorrupted naming the file: a checkpoint written by rlpipe never does,
so someone altered it (digests do not help when the writer of the bucket rewrites
CHECKPOINT.json too).

Not here: where checkpoints live (storage/checkpoint_store.py writes a lake's checkpoint
folders, workers/checkpoint_writer.py in the background), the gathering of the contents and
the streamed files themselves (rl/checkpoint_contents.py).
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import torch
from peft import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors import SafetensorError
from safetensors.torch import load_file

from rlpipe.core.errors import LakeCorrupted
from rlpipe.rl.checkpoint_layout import (  # noqa: F401 - re-exported
    ADAPTER_DIR,
    ADAPTER_FILE,
    LEGACY_LAYOUT,
    META_FILE,
    OPTIMIZER_FILE,
    WEIGHTS_FILE,
    CheckpointLayout,
    layout_of,
)
from rlpipe.rl.checkpoint_contents import CheckpointMeta, ContentsGatherer, write_contents  # noqa: F401 - re-exported
from rlpipe.rl.lora import is_lora_model


def save_checkpoint(folder: Path, model, tokenizer, trainer_state: dict, meta: CheckpointMeta) -> None:
    """Write the checkpoint folder (rl/checkpoint_layout.py) at `folder`, made if missing; a
    LoRA model writes its merged weights as the model files and its adapter to adapter/."""
    contents = ContentsGatherer().gather(model, tokenizer, trainer_state, meta)
    write_contents(contents, lambda relative: _local_file(folder / relative))


def _local_file(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "wb")


def folder_layout(folder: Path) -> CheckpointLayout:
    """The layout of a local checkpoint folder (the older one has its model in policy/)."""
    return LEGACY_LAYOUT if (folder / LEGACY_LAYOUT.weights_file).is_file() else layout_of(())


def load_policy_weights(folder: Path, model) -> None:
    """Load the model.safetensors of a checkpoint folder into `model` in place (a LoRA
    model: adapter/ into its adapter, see the module docstring)."""
    if is_lora_model(model):
        load_adapter(folder, model)
        return
    state = load_file(str(folder / folder_layout(folder).weights_file))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings are saved once; anything else missing is a broken checkpoint.
    missing = [name for name in missing if name != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"checkpoint {folder} does not match the model: missing={missing} unexpected={unexpected}")
    if "lm_head.weight" not in state and getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()


def load_adapter(folder: Path, model) -> None:
    """Load adapter/adapter_model.safetensors into a peft model's adapter, exactly;
    ValueError when the checkpoint has no adapter or another one (rank, target modules)."""
    path = folder / folder_layout(folder).adapter_file
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
    layout = folder_layout(folder)
    trainer_state = load_trainer_state(folder / layout.optimizer_file, f"{(source or str(folder)).rstrip('/')}/{layout.optimizer_file}")
    meta = CheckpointMeta(**json.loads((folder / layout.meta_file).read_text()))
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
