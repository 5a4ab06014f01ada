"""The trainer's AdamW (rl/trainer.lean_adamw): torch's fused kernel on CPU, which updates in
place with no temporaries; an update with it equals the unfused one up to float rounding, its
state is the same (keys, fp32 moments), a state saved by the unfused optimizer keeps training
fused, and the gradients are freed right after each optimizer step."""

import copy

import torch

from rlpipe.rl.batching import TrainSample
from rlpipe.rl.trainer import Trainer
from tests.rl.test_trainer import samples_from_engine


def test_fused_adamw_update_equals_the_unfused_one_up_to_rounding(tiny_model, tokenizer):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: 1.0 if i % 2 == 0 else -1.0)
    fused = Trainer(copy.deepcopy(tiny_model), lr=1e-2, weight_decay=0.01, micro_batch_size=3, mini_batches_per_step=2)
    unfused = Trainer(copy.deepcopy(tiny_model), lr=1e-2, weight_decay=0.01, micro_batch_size=3, mini_batches_per_step=2)
    unfused.optimizer = torch.optim.AdamW(list(unfused.model.parameters()), lr=1e-2, weight_decay=0.01)  # torch's CPU default
    assert fused.optimizer.param_groups[0]["fused"] and not unfused.optimizer.param_groups[0]["fused"]
    for _ in range(3):  # 6 optimizer steps
        fused.update(samples, shuffle_seed=1)
        unfused.update(samples, shuffle_seed=1)
    moved = 0.0
    for (name, a), b, start in zip(fused.model.named_parameters(), unfused.model.parameters(), tiny_model.parameters()):
        # 6 steps of lr 1e-2 move a weight by up to ~6e-2; the two kernels differ in the last
        # bits (~1e-7 here). Except the key bias: q.(k + b) adds q.b to every key's score, which
        # softmax ignores, so its true gradient is 0 and its float gradient rounding noise, which
        # Adam scales up to steps of ~lr: each run follows its own noise (5e-6 apart after 6
        # steps, measured, against 4e-2 of motion).
        tolerance = 1e-4 if name.endswith("k_proj.bias") else 1e-6
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=tolerance, msg=name)
        moved = max(moved, float((a - start).detach().abs().max()))
        assert a.grad is None  # freed after the step
    assert moved > 1e-3  # the weights did train
    fused_state, unfused_state = fused.optimizer.state_dict()["state"], unfused.optimizer.state_dict()["state"]
    assert fused_state.keys() == unfused_state.keys()
    for index, state in fused_state.items():
        assert state.keys() == unfused_state[index].keys() and state["exp_avg_sq"].dtype == torch.float32


def test_a_state_saved_unfused_trains_on_fused_and_exactly_like_the_fused_run(tiny_model, tokenizer):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: 1.0 if i % 2 == 0 else -1.0)
    uninterrupted = Trainer(copy.deepcopy(tiny_model), lr=1e-2)
    uninterrupted.update(samples, shuffle_seed=1)
    saved = copy.deepcopy(uninterrupted.state_dict())  # as read back from a checkpoint: tensors of its own
    saved["param_groups"][0]["fused"] = None  # as an unfused optimizer saved it
    resumed = Trainer(copy.deepcopy(uninterrupted.model), lr=1e-2)
    resumed.load_state_dict(saved)
    assert resumed.optimizer.param_groups[0]["fused"]
    uninterrupted.update(samples, shuffle_seed=2)
    resumed.update(samples, shuffle_seed=2)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted.model.parameters(), resumed.model.parameters()))


def test_the_gradient_is_freed_after_the_step(tiny_model, tokenizer):
    sample = TrainSample((5, 6), (7, 8), (-1.0, -1.0), 1.0)
    trainer = Trainer(tiny_model, lr=1e-2)
    assert trainer.update([sample]).grad_norm > 0
    assert all(parameter.grad is None for parameter in trainer.model.parameters())
