"""warmstart.keep_optimizer: the warm start steps the RL trainer's AdamW, and RL goes on with
its second moments (rl/warmstart.py, Trainer.warm_start_optimizer / drop_momentum)."""

import copy

import pytest
import torch

from rlpipe.rl.trainer import Trainer
from rlpipe.rl.warmstart import warm_start
from tests.rl.test_trainer import samples_from_engine

EXAMPLES = [(f"{a}+{b}=", str(a + b)) for a in range(5) for b in range(5)]


def test_the_kept_optimizer_trains_as_the_warm_starts_own(tiny_model, tokenizer):
    own, initial = copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)
    own_losses = warm_start(own, tokenizer, EXAMPLES, steps=5, batch_size=8, lr=1e-2, seed=0)
    trainer = Trainer(tiny_model, lr=1e-4)
    optimizer, weights = trainer.warm_start_optimizer()
    kept_losses = warm_start(tiny_model, tokenizer, EXAMPLES, steps=5, batch_size=8, lr=1e-2, seed=0,
                             optimizer=optimizer, weights=weights)
    # the same steps up to float rounding (the trainer's AdamW is torch's fused kernel; a weight
    # whose gradient is rounding noise, like a key bias, may step either way, so compare losses)
    assert kept_losses == pytest.approx(own_losses, rel=1e-4)
    assert any(not torch.equal(kept, before) for kept, before in zip(tiny_model.parameters(), initial.parameters()))


def test_rl_goes_on_with_the_warm_starts_second_moments_and_lr(tiny_model, tokenizer):
    trainer = Trainer(tiny_model, lr=1e-4)
    optimizer, weights = trainer.warm_start_optimizer()
    warm_start(tiny_model, tokenizer, EXAMPLES, steps=5, batch_size=8, lr=1e-2, seed=0, optimizer=optimizer, weights=weights)
    assert [group["lr"] for group in trainer.optimizer.param_groups] == [1e-4]  # the RL lr is back
    states = list(trainer.optimizer.state.values())
    assert states and {int(state["step"]) for state in states} == {5}
    second = [state["exp_avg_sq"].clone() for state in states]
    assert all(state["exp_avg"].abs().sum() > 0 for state in states)
    trainer.drop_momentum()
    assert all(not state["exp_avg"].any() for state in states)
    assert all(torch.equal(state["exp_avg_sq"], kept) for state, kept in zip(states, second))
    trainer.update(samples_from_engine(tiny_model, tokenizer, lambda i: 1.0 if i % 2 == 0 else -1.0))
    assert {int(state["step"]) for state in trainer.optimizer.state.values()} == {6}
    assert "exp_avg_sq" in trainer.state_dict()["state"][0]  # a checkpoint after the warm start keeps them


def test_an_optimizer_without_its_weights_is_refused(tiny_model, tokenizer):
    optimizer, _ = Trainer(tiny_model, lr=1e-4).warm_start_optimizer()
    with pytest.raises(ValueError, match="both an optimizer and its master weights"):
        warm_start(tiny_model, tokenizer, EXAMPLES, steps=1, batch_size=1, lr=1e-3, seed=0, optimizer=optimizer)
