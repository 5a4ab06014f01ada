"""Supervised warm-start: next-token loss on reference answers before RL.

What it does: for a fixed budget of `steps` AdamW steps of `batch_size` examples each
(sampled with replacement, seeded), trains the model on prompt + answer + EOS with the loss
on the answer tokens and the EOS token only (the prompt is context, not a target). An
example is (prompt, answer), or (prompt, segments) for a whole multi-turn episode:
segments are (text, trained) pairs in order (the replies trained, the tool output between
them context only, as in the RL loss), each tokenized on its own, so one sequence trains
every reply of the episode given what came before it (controller/agent_episodes.py). Ending
every answer with EOS is what teaches the policy to stop; the rollout engine stops on EOS
(an answer whose text already ends with the EOS token, as a chat episode's closed last reply
does, gets no second one).
A tiny random model needs this to be partially right (non-zero pass rate) before GRPO has
any reward signal. The budget is exactly steps * batch_size sequences, constant learning
rate, gradients clipped to norm 1.0. Only parameters that require gradients train (a LoRA
policy trains its adapter); bf16 weights train through fp32 master weights (rl/precision.py).

By default it steps its own AdamW, dropped at the end. Given `optimizer` and `weights` (the
RL trainer's: Trainer.warm_start_optimizer()), it steps those at the warm-start's lr instead
and restores their lr at the end, so the RL updates continue the warm start's optimizer
state (warmstart.keep_optimizer; the trainer then zeroes the momentum).

An optional `stop_check` ends it early (the caller decides how: the train flow checks greedy
accuracy on a sample of training tasks against `warmstart.target_accuracy`). An optional
`on_step(step, loss)` hears of every step (the caller reports progress and metrics).

What it does not: evaluate, schedule the learning rate, or read datasets from disk.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rlpipe.core.records import Segments
from rlpipe.rl.batching import TrainSample, pad_samples, token_logprobs
from rlpipe.rl.precision import MasterWeights

SupervisedExample = tuple[str, str] | tuple[str, Segments]
"""(prompt, answer) or (prompt, ((text, trained), ...)): see the module docstring."""


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: list[SupervisedExample],
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    weight_decay: float = 0.0,
    stop_check: Callable[[int], bool] | None = None,
    check_every: int = 5,
    on_step: Callable[[int, float], None] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    weights: MasterWeights | None = None,
) -> list[float]:
    """Train on the examples; returns the mean trained-token loss of every step.

    `stop_check(steps_done)`, called every `check_every` steps, ends the warm-start early
    when it returns True (e.g. once the policy is right often enough for RL to learn from);
    `steps` stays the upper bound of the budget. `on_step(step, loss)` is called after every
    optimizer step, before the stop check."""
    if steps <= 0:
        return []
    if not examples:
        raise ValueError("warm_start needs at least one (prompt, answer) example")
    if tokenizer.eos_token_id is None:
        raise ValueError("warm_start needs a tokenizer with an EOS token (it marks the end of an answer)")
    encoded = [_encode(tokenizer, prompt, answer) for prompt, answer in examples]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if (optimizer is None) != (weights is None):
        raise ValueError("warm_start needs both an optimizer and its master weights, or neither")
    if weights is None:
        weights = MasterWeights([parameter for parameter in model.parameters() if parameter.requires_grad])
        optimizer = torch.optim.AdamW(weights.stepped, lr=lr, weight_decay=weight_decay)
    else:
        weights.sync_if_model_changed()
    saved_lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = lr
    try:
        return _train(model, encoded, steps, batch_size, seed, pad_id, optimizer, weights, stop_check, check_every, on_step)
    finally:
        for group, saved in zip(optimizer.param_groups, saved_lrs):
            group["lr"] = saved


def _train(model: PreTrainedModel, encoded: list[TrainSample], steps: int, batch_size: int, seed: int, pad_id: int,
           optimizer: torch.optim.Optimizer, weights: MasterWeights, stop_check: Callable[[int], bool] | None,
           check_every: int, on_step: Callable[[int, float], None] | None) -> list[float]:
    rng = random.Random(seed)
    device = next(model.parameters()).device
    model.train()
    losses: list[float] = []
    for step in range(1, steps + 1):
        batch = pad_samples([rng.choice(encoded) for _ in range(batch_size)], pad_id, device)
        logprobs = token_logprobs(model, batch)
        loss = -(logprobs * batch.completion_mask).sum() / batch.completion_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        weights.move_grads()
        torch.nn.utils.clip_grad_norm_(weights.stepped, 1.0)
        optimizer.step()
        weights.copy_to_model()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step, losses[-1])
        if stop_check is not None and step % check_every == 0 and step < steps:
            model.eval()
            if stop_check(step):
                break
            model.train()
    model.eval()
    return losses


def _encode(tokenizer: PreTrainedTokenizerBase, prompt: str, answer: str | Segments) -> TrainSample:
    """The answer (or the segments) + EOS as the 'completion' of a sample (advantage unused
    here); untrained segments are masked out of the loss."""
    prompt_ids = tuple(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    segments: Segments = ((answer, True),) if isinstance(answer, str) else tuple(answer)
    token_ids: list[int] = []
    mask: list[int] = []
    for text, trained in segments:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        token_ids += ids
        mask += [int(trained)] * len(ids)
    if token_ids[-1:] != [tokenizer.eos_token_id]:  # a chat episode's last reply already ends with it
        token_ids.append(tokenizer.eos_token_id)
        mask.append(1)
    return TrainSample(prompt_token_ids=prompt_ids, token_ids=tuple(token_ids), old_logprobs=(0.0,) * len(token_ids),
                       advantage=None, loss_mask=None if all(mask) else tuple(mask))
