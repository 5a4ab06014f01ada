"""fp32 master weights for trainable parameters stored in a lower precision (bfloat16).

Why: bf16 keeps 8 significant bits, so an AdamW step of lr ~ 1e-6..1e-5 on a weight of ~0.02
is far below half a bf16 step there (2^-13 / 2 ~ 6e-5) and rounds away: pure bf16 AdamW does
not move the policy. So the optimizer steps fp32 copies ("masters"), gradients are added
into the masters' fp32 `.grad` after each backward (fp32 accumulation over micro-batches),
and after each optimizer step the model's weights are the masters rounded to their dtype.
Cost: 4 bytes per trainable parameter. fp32 parameters get no copy (the optimizer steps them
directly), so an fp32 model, or a LoRA adapter (fp32 on a bf16 base), pays nothing.

What it does not: create the optimizer, clip, or save files (the trainer does).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class MasterWeights:
    """The tensors an optimizer should step for `parameters`, and the copies between them."""

    def __init__(self, parameters: list[torch.nn.Parameter]) -> None:
        self.parameters = parameters
        self.masters: list[torch.Tensor] | None = None
        if any(parameter.dtype != torch.float32 for parameter in parameters):
            self.masters = [parameter.detach().float().clone() for parameter in parameters]

    @property
    def stepped(self) -> list[torch.Tensor]:
        """What the optimizer steps and what gradient clipping sees."""
        return self.masters if self.masters is not None else list(self.parameters)

    def move_grads(self) -> None:
        """After a backward: add each low-precision gradient into its master's, free it."""
        if self.masters is None:
            return
        for parameter, master in zip(self.parameters, self.masters):
            if parameter.grad is None:
                continue
            if master.grad is None:
                master.grad = parameter.grad.float()
            else:
                master.grad += parameter.grad.float()
            parameter.grad = None

    def copy_to_model(self) -> None:
        """After an optimizer step: the model's weights = the masters rounded to their dtype."""
        if self.masters is not None:
            with torch.no_grad():
                for parameter, master in zip(self.parameters, self.masters):
                    parameter.copy_(master)

    def sync_if_model_changed(self, before_change: Callable[[], None] | None = None) -> bool:
        """Re-read the masters from the weights when something else changed the weights (a
        warm-start, a checkpoint's weights loaded): a master that no longer rounds to its
        weight is stale. `before_change` is called once before the first master is
        overwritten (the trainer's wait for a checkpoint write that reads them). Returns
        whether any was stale."""
        if self.masters is None:
            return False
        stale = False
        with torch.no_grad():
            for parameter, master in zip(self.parameters, self.masters):
                if not torch.equal(master.to(parameter.dtype), parameter):
                    if not stale and before_change is not None:
                        before_change()
                    master.copy_(parameter.float())
                    stale = True
        return stale

    def state(self) -> list[torch.Tensor] | None:
        """The masters themselves (detached, no copy: a checkpoint writes them as they are)."""
        return None if self.masters is None else [master.detach() for master in self.masters]

    def load(self, saved: list[torch.Tensor] | None) -> None:
        """Masters from `state()`; None (e.g. an fp32 run's checkpoint) re-reads the weights."""
        if self.masters is None:
            return
        if saved is None:
            self.sync_if_model_changed()
            return
        if len(saved) != len(self.masters):
            raise ValueError(f"the trainer state holds {len(saved)} master weights, the model has {len(self.masters)} trainable tensors")
        with torch.no_grad():
            for master, tensor in zip(self.masters, saved):
                master.copy_(tensor)
        self.copy_to_model()
