"""The policy trainer: one clipped policy-gradient update per RL step, AdamW, grad clipping.

What it does: `update(samples, shuffle_seed)` shuffles the step's samples (a local
`random.Random(shuffle_seed)`, never the global RNG, so a replay on resume is bit-identical;
as TRL's GRPOTrainer does, so each optimizer step sees samples of most of the step's tasks
instead of a quarter of them), splits them into `mini_batches_per_step` mini-batches
(PPO-style; verl's ppo_mini_batch_size) and runs one optimizer step per mini-batch,
`epochs_per_step` times over (each epoch reshuffles, from the same seeded stream). Each optimizer step accumulates gradients over
micro-batches whose losses are normalised by the WHOLE mini-batch's token (token_mean) or
sequence (seq_mean_token_sum) count, so the accumulated gradient equals the mini-batch
gradient whatever the micro-batch size. Mini-batches after the first are slightly
off-policy; the clipped importance ratio against the stored sampling logprobs accounts for it.
New logprobs are computed at the sampling `temperature` (log_softmax(logits / T), the
convention of engines/base.py), so the ratio of an unchanged policy is 1.
Samples with advantage None are excluded entirely; samples with advantage 0.0 add nothing
to the policy-gradient term, so without a KL penalty they are skipped for speed, but still
count in the normaliser and in `tokens`. With kl_coef > 0 a frozen reference model is kept
(a deep copy of the initial model unless one is passed) and every scored sample trains.

`state_dict()` / `load_state_dict()` cover the optimizer (the model's weights are saved by
the caller); `named_weights()` yields the tensors to sync into a rollout engine.

What it does not: sample, verify, compute advantages, save files, or handle more than one
device (FSDP/torchrun come later behind the same methods).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from rlpipe.rl.batching import TrainSample, completion_tokens, micro_batches, pad_samples, token_logprobs
from rlpipe.rl.losses import LossAggregation, policy_loss

__all__ = ["Trainer", "TrainSample", "UpdateMetrics"]


@dataclass(frozen=True)
class UpdateMetrics:
    """What one `update` did. loss/kl/clip_frac are averaged over epochs; grad_norm is the
    pre-clip norm of the first optimizer step; tokens = completion tokens of the scored samples."""

    loss: float
    kl: float
    grad_norm: float
    clip_frac: float
    tokens: int


class Trainer:
    """Owns the policy's optimizer (and the reference model when kl_coef > 0)."""

    def __init__(
        self,
        model: PreTrainedModel,
        lr: float,
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
        micro_batch_size: int = 64,
        epochs_per_step: int = 1,
        mini_batches_per_step: int = 1,
        clip_eps: float = 0.2,
        kl_coef: float = 0.0,
        loss_agg: LossAggregation = "token_mean",
        reference_model: PreTrainedModel | None = None,
        pad_token_id: int = 0,
        temperature: float = 1.0,
    ) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (the rollouts' sampling temperature), got {temperature}")
        self.model = model
        self.temperature = temperature
        self.grad_clip = grad_clip
        self.micro_batch_size = micro_batch_size
        self.epochs_per_step = epochs_per_step
        self.mini_batches_per_step = mini_batches_per_step
        self.clip_eps = clip_eps
        self.kl_coef = kl_coef
        self.loss_agg = loss_agg
        self.pad_token_id = pad_token_id
        self.reference_model = reference_model
        if kl_coef > 0 and reference_model is None:
            self.reference_model = copy.deepcopy(model)
        if self.reference_model is not None:
            self.reference_model.eval().requires_grad_(False)
        self._device = next(model.parameters()).device
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)

    def update(self, samples: list[TrainSample], shuffle_seed: int | None = None) -> UpdateMetrics:
        """One RL update on the step's samples; see the module docstring. `shuffle_seed`
        None keeps the samples' order (contiguous mini-batches), for tests that need it."""
        scored = [sample for sample in samples if sample.advantage is not None]
        tokens = completion_tokens(scored)
        losses, kls, clips, grad_norms = [], [], [], []
        order = random.Random(shuffle_seed) if shuffle_seed is not None else None
        self.model.train()
        for _ in range(self.epochs_per_step):
            if order is not None:
                scored = scored[:]
                order.shuffle(scored)
            for mini_batch in _split(scored, self.mini_batches_per_step):
                trained = mini_batch if self.kl_coef > 0 else [s for s in mini_batch if s.advantage != 0.0]
                if not trained:
                    continue
                mini_tokens = completion_tokens(mini_batch)
                normalizer = float(mini_tokens if self.loss_agg == "token_mean" else len(mini_batch))
                loss, kl, clip_frac = self._accumulate(trained, normalizer, mini_tokens)
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)))
                self.optimizer.step()
                losses.append(loss), kls.append(kl), clips.append(clip_frac)
        self.model.eval()
        if not losses:
            return UpdateMetrics(loss=0.0, kl=0.0, grad_norm=0.0, clip_frac=0.0, tokens=tokens)
        return UpdateMetrics(
            loss=sum(losses) / len(losses),
            kl=sum(kls) / len(kls),
            grad_norm=grad_norms[0],
            clip_frac=sum(clips) / len(clips),
            tokens=tokens,
        )

    def _accumulate(self, trained: list[TrainSample], normalizer: float, tokens: int) -> tuple[float, float, float]:
        """Backward over all micro-batches; returns (loss, token-mean kl, clip_frac over `tokens`)."""
        self.optimizer.zero_grad(set_to_none=True)
        total_loss, kl_sum, clip_sum = 0.0, 0.0, 0.0
        for chunk in micro_batches(trained, self.micro_batch_size):
            batch = pad_samples(chunk, self.pad_token_id, self._device)
            new_logprobs = token_logprobs(self.model, batch, self.temperature)
            ref_logprobs = None
            if self.reference_model is not None and self.kl_coef > 0:
                with torch.no_grad():
                    ref_logprobs = token_logprobs(self.reference_model, batch, self.temperature)
            loss, metrics = policy_loss(
                new_logprobs,
                batch.old_logprobs,
                batch.advantages,
                batch.completion_mask,
                self.clip_eps,
                ref_logprobs=ref_logprobs,
                kl_coef=self.kl_coef,
                loss_agg=self.loss_agg,
                normalizer=normalizer,
            )
            loss.backward()
            total_loss += loss.item()
            kl_sum += metrics.kl * metrics.tokens
            clip_sum += metrics.clip_frac * metrics.tokens
        return total_loss, kl_sum / max(tokens, 1), clip_sum / max(tokens, 1)

    def reset_reference(self) -> None:
        """Make the KL reference a copy of the current policy (e.g. after the warm-start)."""
        if self.reference_model is not None:
            self.reference_model.load_state_dict(self.model.state_dict())

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) of every parameter, detached, for `RolloutEngine.load_weights`."""
        for name, parameter in self.model.named_parameters():
            yield name, parameter.detach()

    def state_dict(self) -> dict[str, Any]:
        """The optimizer state (torch's own format; save with torch.save or safetensors+json)."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)


def _split(samples: list[TrainSample], parts: int) -> list[list[TrainSample]]:
    """`parts` consecutive slices of near-equal size (of the shuffled samples, in `update`)."""
    parts = max(1, min(parts, len(samples)))
    size, extra = divmod(len(samples), parts)
    chunks, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        chunks.append(samples[start:end])
        start = end
    return chunks
