"""From training samples to padded tensors, and per-token logprobs of a model on them.

Layout: each row is prompt_token_ids + token_ids, RIGHT-padded to the longest row. Logprobs
live on the shifted grid [batch, length - 1]: column j holds log p(token j+1 | tokens <= j).
The completion mask is 1 exactly on the columns that predict completion tokens the policy
sampled, so `old_logprobs` from the engine (one per completion token) land on the same
columns. A multi-turn episode's completion also holds tool output (observation tokens) between
the policy's turns: its `loss_mask` is 0 there, and so is the completion mask, so those tokens
are context only: no loss term, no gradient, not counted in `completion_tokens`.

Logprobs are those of the sampling distribution at temperature T: log_softmax(logits / T),
the convention of engines/base.py. They are computed as gather - logsumexp in float32 over
the columns from the first completion column on only (the model's `logits_to_keep`: the LM
head itself projects only those positions), never as a full-vocabulary log_softmax over every
position (or, with `chunk_positions`, through rl/chunked_logprobs.py: the LM head and
logsumexp a chunk of positions at a time, the logits recomputed in the backward pass);
columns before that hold 0. The model runs with `use_cache=False` (a training
forward keeps no KV cache).

This module does not decide which samples train nor in which order (the trainer does).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from rlpipe.rl.chunked_logprobs import chunked_target_logprobs, decoder_hidden_states, supports_chunked_logprobs


@dataclass(frozen=True)
class TrainSample:
    """One completion as the trainer sees it. advantage None = excluded (reward could not be scored)."""

    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    old_logprobs: tuple[float, ...]
    advantage: float | None
    proximal_logprobs: tuple[float, ...] | None = None
    """The trainer's own logprobs of `token_ids` before the update (truncated importance
    sampling): the PPO ratio's denominator, while `old_logprobs` (the engine's, the
    behaviour policy's) then only enter the TIS weight. None: the ratio uses old_logprobs."""
    loss_mask: tuple[int, ...] | None = None
    """1 on the `token_ids` the policy sampled, 0 on tool output (multi-turn episodes);
    None: every token was sampled."""

    @property
    def loss_tokens(self) -> int:
        """How many of `token_ids` enter the loss."""
        return len(self.token_ids) if self.loss_mask is None else sum(1 for bit in self.loss_mask if bit)


@dataclass(frozen=True)
class PaddedBatch:
    """Tensors of one micro-batch; see the module docstring for the layout."""

    input_ids: torch.Tensor  # [batch, length] long
    attention_mask: torch.Tensor  # [batch, length] long
    targets: torch.Tensor  # [batch, length - 1] long: input_ids shifted left
    completion_mask: torch.Tensor  # [batch, length - 1] float
    old_logprobs: torch.Tensor  # [batch, length - 1] float, 0 outside the mask
    advantages: torch.Tensor  # [batch] float
    proximal_logprobs: torch.Tensor | None = None  # [batch, length - 1] float, when every sample has them


def pad_samples(samples: list[TrainSample], pad_token_id: int = 0, device: str | torch.device = "cpu") -> PaddedBatch:
    """Right-pad prompt + completion of every sample into one batch."""
    if not samples:
        raise ValueError("pad_samples needs at least one sample")
    for sample in samples:
        if len(sample.old_logprobs) != len(sample.token_ids):
            raise ValueError(f"{len(sample.token_ids)} completion tokens but {len(sample.old_logprobs)} logprobs")
        if not sample.prompt_token_ids:
            raise ValueError("a sample needs at least one prompt token")
        if sample.loss_mask is not None and len(sample.loss_mask) != len(sample.token_ids):
            raise ValueError(f"{len(sample.token_ids)} completion tokens but a loss mask of {len(sample.loss_mask)}")
        if sample.proximal_logprobs is not None and len(sample.proximal_logprobs) != len(sample.token_ids):
            raise ValueError(f"{len(sample.token_ids)} completion tokens but {len(sample.proximal_logprobs)} proximal logprobs")
    with_proximal = [sample.proximal_logprobs is not None for sample in samples]
    if any(with_proximal) and not all(with_proximal):
        raise ValueError("either every sample of a batch has proximal logprobs or none has")
    length = max(len(sample.prompt_token_ids) + len(sample.token_ids) for sample in samples)
    batch = len(samples)
    input_ids = torch.full((batch, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, length), dtype=torch.long)
    completion_mask = torch.zeros((batch, length - 1), dtype=torch.float32)
    old_logprobs = torch.zeros((batch, length - 1), dtype=torch.float32)
    proximal = torch.zeros((batch, length - 1), dtype=torch.float32) if all(with_proximal) else None
    for row, sample in enumerate(samples):
        prompt_len, completion_len = len(sample.prompt_token_ids), len(sample.token_ids)
        ids = sample.prompt_token_ids + sample.token_ids
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
        completion_mask[row, prompt_len - 1 : prompt_len - 1 + completion_len] = (
            1.0 if sample.loss_mask is None else torch.tensor(sample.loss_mask, dtype=torch.float32))
        old_logprobs[row, prompt_len - 1 : prompt_len - 1 + completion_len] = torch.tensor(sample.old_logprobs, dtype=torch.float32)
        if proximal is not None:
            proximal[row, prompt_len - 1 : prompt_len - 1 + completion_len] = torch.tensor(sample.proximal_logprobs, dtype=torch.float32)
    advantages = torch.tensor([sample.advantage or 0.0 for sample in samples], dtype=torch.float32)
    return PaddedBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        targets=input_ids[:, 1:].to(device),
        completion_mask=completion_mask.to(device),
        old_logprobs=old_logprobs.to(device),
        advantages=advantages.to(device),
        proximal_logprobs=None if proximal is None else proximal.to(device),
    )


def token_logprobs(model: PreTrainedModel, batch: PaddedBatch, temperature: float = 1.0,
                   chunk_positions: int = 0) -> torch.Tensor:
    """log p_T(target) of the shifted positions, [batch, length - 1], at temperature T;
    exact on every completion column (0 on prompt columns before the first completion one).
    `chunk_positions` > 0: through rl/chunked_logprobs.py (that many positions' vocabulary
    logits at a time, recomputed in the backward pass) where the model supports it; 0, or a
    model that does not: the model's own logits of all kept positions at once."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    columns = batch.targets.shape[1]
    first = int(batch.completion_mask.any(dim=0).float().argmax()) if bool(batch.completion_mask.any()) else columns - 1
    if chunk_positions > 0 and supports_chunked_logprobs(model):
        hidden = decoder_hidden_states(model, batch.input_ids, batch.attention_mask)[:, first:-1]
        selected = chunked_target_logprobs(hidden, model.get_output_embeddings(), batch.targets[:, first:], temperature,
                                           chunk_positions)
        return torch.nn.functional.pad(selected, (first, 0))
    keep = columns - first + 1  # logits of positions first .. length-1; the last predicts nothing
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep,
                   use_cache=False).logits[:, :-1, :]
    selected = logprobs_of_targets(logits, batch.targets[:, first:], temperature)
    return torch.nn.functional.pad(selected, (first, 0))


def logprobs_of_targets(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / T)[target] per position: [..., vocab] logits, [...] targets ->
    [...] float32, as gather - logsumexp (no full log_softmax tensor is kept)."""
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    return scaled.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(scaled, dim=-1)


def micro_batches(samples: list[TrainSample], size: int) -> list[list[TrainSample]]:
    """Consecutive chunks of at most `size` samples."""
    if size < 1:
        raise ValueError(f"micro batch size must be >= 1, got {size}")
    return [samples[start : start + size] for start in range(0, len(samples), size)]


def completion_tokens(samples: list[TrainSample]) -> int:
    """The tokens that enter the loss (tool output of an episode excluded)."""
    return sum(sample.loss_tokens for sample in samples)
