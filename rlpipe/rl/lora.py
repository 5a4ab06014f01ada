"""LoRA adapters (peft) on the policy: wrap, read and write the adapter, merge for export.

What it does:
- `apply_lora(model, rank, alpha, target_modules)` wraps a causal LM in a peft
  `PeftModelForCausalLM` with one LoRA adapter ("default", dropout 0, so a forward is
  deterministic and an update replays exactly). peft freezes every base weight; only the
  adapter's lora_A / lora_B matrices require gradients. Adapter weights are float32 even on a
  bfloat16 base (peft's `autocast_adapter_dtype`), so their optimizer needs no master copy.
  The engine worker wraps its own copy with the same call, so the names of
  `adapter_named_parameters` (the PeftModel's `named_parameters` names, e.g.
  `base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight`) load into it.
- `adapter_state` / `load_adapter_state`: the adapter's tensors by those names, and back
  (strict: the same set of names and shapes, else ValueError).
- `merged_copy(model)`: a plain transformers model (no peft) whose weights are
  base + alpha/rank * B @ A, for an HF folder that `AutoModelForCausalLM` loads as is. It
  merges a deep copy: the trainer's model keeps its base and adapter bit for bit (peft's
  merge/unmerge in place would round the base).

What it does not: choose the rank or the target modules (the config does), train, or save
files (rl/checkpoint.py).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from transformers import PreTrainedModel


def apply_lora(model: PreTrainedModel, rank: int, alpha: float, target_modules: Sequence[str]) -> PeftModel:
    """`model` wrapped with a fresh LoRA adapter (modified in place: peft injects the adapter
    layers into its modules and freezes its weights). ValueError when no module matches."""
    if rank <= 0:
        raise ValueError(f"LoRA rank must be > 0, got {rank}; use lora_rank = 0 to train every weight")
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [name for name in target_modules if name not in present]
    if not target_modules or len(missing) == len(target_modules):
        raise ValueError(
            f"none of the LoRA target modules {list(target_modules)} is in the model; "
            f"set train.lora_target_modules to linear layers it has (e.g. q_proj, v_proj)"
        )
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=[name for name in target_modules if name in present],
                        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def is_lora_model(model: torch.nn.Module) -> bool:
    return isinstance(model, PeftModel)


def has_lora_layers(model: torch.nn.Module) -> bool:
    """True for a peft model and for the base model inside one (peft injects its layers there)."""
    return any(isinstance(module, LoraLayer) for module in model.modules())


def adapter_named_parameters(model: PeftModel) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """The adapter's parameters (those that require gradients), by the PeftModel's names."""
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            yield name, parameter


def adapter_state(model: PeftModel) -> dict[str, torch.Tensor]:
    """The adapter tensors (detached, contiguous, on the CPU) by `adapter_named_parameters` name."""
    return {name: parameter.detach().to("cpu").contiguous() for name, parameter in adapter_named_parameters(model)}


def load_adapter_state(model: PeftModel, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` (as `adapter_state` wrote it) into the adapter in place, exactly."""
    parameters = dict(adapter_named_parameters(model))
    if state.keys() != parameters.keys():
        missing = sorted(parameters.keys() - state.keys())[:3]
        unexpected = sorted(state.keys() - parameters.keys())[:3]
        raise ValueError(f"the LoRA adapter does not match the model: missing={missing} unexpected={unexpected}; "
                         "was it written with other train.lora_rank / lora_target_modules?")
    with torch.no_grad():
        for name, tensor in state.items():
            if tensor.shape != parameters[name].shape:
                raise ValueError(f"LoRA tensor {name} has shape {tuple(tensor.shape)}, the model's is "
                                 f"{tuple(parameters[name].shape)}; was the rank changed?")
            parameters[name].copy_(tensor.to(parameters[name].device, parameters[name].dtype))


def merged_copy(model: PeftModel) -> PreTrainedModel:
    """A plain transformers model with the adapter merged into a copy of the base weights."""
    if not has_lora_layers(model):
        raise ValueError("merged_copy needs a model with LoRA layers")
    merged = copy.deepcopy(model).merge_and_unload()
    merged.requires_grad_(True)  # a plain model again, as load_local_model gives one
    return merged
