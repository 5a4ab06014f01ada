"""Trainer, batching and warm-start on a tiny CPU model."""

import pytest
import torch

from rlpipe.engines.base import SamplingParams
from rlpipe.engines.hf import HFEngine
from rlpipe.rl.batching import TrainSample, pad_samples, token_logprobs
from rlpipe.rl.trainer import Trainer
from rlpipe.rl.warmstart import warm_start


def samples_from_engine(model, tokenizer, advantage_of):
    completions = HFEngine(model, tokenizer).generate([("a", "1+2="), ("b", "reverse ab=")], SamplingParams(n=4, max_new_tokens=4, seed=0))
    return [TrainSample(c.prompt_token_ids, c.token_ids, c.logprobs, advantage_of(i)) for i, c in enumerate(completions)]


def sequence_logprob(model, sample):
    batch = pad_samples([sample])
    with torch.no_grad():
        return float((token_logprobs(model, batch) * batch.completion_mask).sum())


def test_pad_samples_layout():
    batch = pad_samples([TrainSample((5, 6), (7,), (-0.5,), 1.0), TrainSample((5,), (8, 9, 1), (-1.0, -2.0, -3.0), None)])
    assert batch.input_ids.tolist() == [[5, 6, 7, 0], [5, 8, 9, 1]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    # column j predicts token j + 1: sample 1's completion token 7 is at column 1; sample 2's at columns 0..2
    assert batch.completion_mask.tolist() == [[0, 1, 0], [1, 1, 1]]
    assert batch.old_logprobs.tolist() == [[0, -0.5, 0], [-1, -2, -3]]
    assert batch.advantages.tolist() == [1.0, 0.0]


def test_updates_raise_logprob_of_positive_and_lower_negative_completions(tiny_model, tokenizer):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: 1.0 if i % 2 == 0 else -1.0)
    before = [sequence_logprob(tiny_model, s) for s in samples]
    trainer = Trainer(tiny_model, lr=1e-2, micro_batch_size=3, clip_eps=0.2)
    for _ in range(3):
        metrics = trainer.update(samples)
        assert metrics.tokens == sum(len(s.token_ids) for s in samples) and metrics.grad_norm > 0
    after = [sequence_logprob(tiny_model, s) for s in samples]
    assert all(a > b for a, b, s in zip(after, before, samples) if s.advantage > 0)
    assert all(a < b for a, b, s in zip(after, before, samples) if s.advantage < 0)


def test_zero_and_none_advantages_do_not_move_the_model(tiny_model, tokenizer):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: None if i < 3 else 0.0)
    weights = [p.clone() for p in tiny_model.parameters()]
    metrics = Trainer(tiny_model, lr=1e-2).update(samples)
    assert metrics.grad_norm == 0.0 and metrics.tokens == sum(len(s.token_ids) for s in samples[3:])
    assert all(torch.equal(a, b) for a, b in zip(weights, tiny_model.parameters()))


def test_micro_batch_size_does_not_change_the_gradient(tiny_model, tokenizer):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: float(i % 3) - 1.0)
    grads = []
    for micro_batch_size in (1, 3, 8):
        trainer = Trainer(tiny_model, lr=0.0, micro_batch_size=micro_batch_size, grad_clip=1e9)
        trainer.update(samples)
        grads.append(torch.cat([p.grad.flatten() for p in tiny_model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6) and torch.allclose(grads[0], grads[2], atol=1e-6)


def test_kl_penalty_reported_and_optimizer_state_round_trips(tiny_model, tokenizer):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: 1.0 if i == 0 else -1.0 / 7)
    trainer = Trainer(tiny_model, lr=1e-2, kl_coef=0.1, epochs_per_step=2)
    first = trainer.update(samples)
    second = trainer.update(samples)
    assert first.kl >= 0.0 and second.kl > 0.0  # the policy moved away from the frozen reference
    state = trainer.state_dict()
    fresh = Trainer(tiny_model, lr=1e-2)
    fresh.load_state_dict(state)
    assert fresh.state_dict()["state"].keys() == state["state"].keys()
    names = [name for name, _ in trainer.named_weights()]
    assert names == [name for name, _ in tiny_model.named_parameters()]


def test_warm_start_lowers_the_answer_loss(tiny_model, tokenizer):
    examples = [(f"{a}+{b}=", str(a + b)) for a in range(5) for b in range(5)]
    losses = warm_start(tiny_model, tokenizer, examples, steps=30, batch_size=16, lr=1e-2, seed=0)
    assert len(losses) == 30 and sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    assert warm_start(tiny_model, tokenizer, examples, steps=0, batch_size=16, lr=1e-2, seed=0) == []
    with pytest.raises(ValueError):
        warm_start(tiny_model, tokenizer, [], steps=1, batch_size=1, lr=1e-3, seed=0)


def test_mini_batches_take_one_optimizer_step_each(tiny_model, tokenizer):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: 1.0 if i % 2 == 0 else -1.0)
    trainer = Trainer(tiny_model, lr=1e-3, mini_batches_per_step=4, epochs_per_step=2)
    trainer.update(samples)
    # 8 samples in 4 mini-batches of 2, two passes: AdamW counted 4 x 2 = 8 steps
    steps = {int(state["step"]) for state in trainer.optimizer.state.values()}
    assert steps == {8}


def test_warm_start_stops_when_the_check_says_so(tiny_model, tokenizer):
    examples = [(f"{a}+{b}=", str(a + b)) for a in range(5) for b in range(5)]
    checked: list[int] = []

    def stop_check(steps_done: int) -> bool:
        checked.append(steps_done)
        return steps_done >= 10

    losses = warm_start(tiny_model, tokenizer, examples, steps=30, batch_size=4, lr=1e-3, seed=0,
                        stop_check=stop_check, check_every=5)
    # checked after steps 5 and 10; True at 10 ends the budget of 30 there
    assert checked == [5, 10] and len(losses) == 10
    assert not tiny_model.training
