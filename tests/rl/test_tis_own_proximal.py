"""Truncated importance sampling's proximal logprobs (rl/trainer.py): with one epoch and no
dropout the first mini-batch takes them from its own update's forward pass, so the separate
no-grad pass covers only the later mini-batches (none with a single optimizer step), and the
update is the one the separate pass for every sample gives, up to float rounding."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from rlpipe.rl.trainer import Trainer
from tests.rl.test_trainer import samples_from_engine, stepped_gradient


def _no_grad_rows(model) -> list[int]:
    """Rows of every forward pass of `model` run without grad (the proximal pass)."""
    rows: list[int] = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: None if torch.is_grad_enabled() else rows.append(kwargs["input_ids"].shape[0]),
        with_kwargs=True)
    return rows


def _update(model, samples, **options):
    trainer = Trainer(copy.deepcopy(model), lr=0.05, tis_cap=2.0, micro_batch_size=3, **options)
    rows = _no_grad_rows(trainer.model)
    gradients = stepped_gradient(trainer)
    metrics = trainer.update(samples, shuffle_seed=7)
    return metrics, gradients, rows, dict(trainer.model.named_parameters())


@pytest.mark.parametrize("mini_batches", [1, 2])
def test_the_first_mini_batch_needs_no_separate_proximal_pass(tiny_model, tokenizer, mini_batches):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: (1.0, -0.5, 0.0, 2.0)[i % 4])
    # the engine's logprobs skewed per token (other numerics): TIS weights differ from 1, some capped
    skewed = [dataclasses.replace(s, old_logprobs=tuple(lp - math.log(1.0 + 0.8 * (k % 3)) for k, lp in enumerate(s.old_logprobs)))
              for s in samples]
    trained = sum(1 for s in skewed if s.advantage != 0.0)
    own, own_gradients, own_rows, own_weights = _update(tiny_model, skewed, mini_batches_per_step=mini_batches)
    reference, gradients, rows, weights = _update(tiny_model, skewed, mini_batches_per_step=mini_batches,
                                                  own_first_proximal=False)

    assert sum(rows) == trained  # the reference scores every trained sample before the first step
    assert sum(own_rows) < trained if mini_batches == 2 else own_rows == []
    assert len(own_gradients) == len(gradients) == mini_batches
    for mine, theirs in zip(own_gradients, gradients):
        assert torch.allclose(mine, theirs, rtol=1e-4, atol=1e-6)
    for name, parameter in weights.items():
        assert torch.allclose(own_weights[name], parameter, rtol=1e-4, atol=1e-6), name
    assert own.tis_capped_frac == pytest.approx(reference.tis_capped_frac) and 0 < own.tis_capped_frac < 1
    assert own.tis_weight == pytest.approx(reference.tis_weight, rel=1e-5)
    assert own.loss == pytest.approx(reference.loss, rel=1e-4, abs=1e-6)


def test_several_epochs_take_every_proximal_logprob_before_the_first_step(tiny_model, tokenizer):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: 1.0 if i % 2 else -1.0)
    _, gradients, rows, _ = _update(tiny_model, samples, mini_batches_per_step=2, epochs_per_step=2)
    assert sum(rows) == len(samples) and len(gradients) == 4  # a later epoch needs them after the weights moved
