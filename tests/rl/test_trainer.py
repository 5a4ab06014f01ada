"""Trainer, batching and warm-start on a tiny CPU model."""

import copy
import dataclasses
import math

import pytest
import torch

from rlpipe.engines.sampling import SamplingParams
from rlpipe.engines.hf import HFEngine
from rlpipe.rl.batching import TrainSample, logprobs_of_targets, pad_samples, token_logprobs
from rlpipe.rl.losses import policy_loss
from rlpipe.rl.trainer import TisUpdateMetrics, Trainer, UpdateMetrics
from rlpipe.rl.warmstart import warm_start


def samples_from_engine(model, tokenizer, advantage_of, temperature=1.0, prompts=(("a", "1+2="), ("b", "reverse ab="))):
    params = SamplingParams(n=4, max_new_tokens=4, seed=0, temperature=temperature)
    completions = HFEngine(model, tokenizer).generate(list(prompts), params)
    return [TrainSample(c.prompt_token_ids, c.token_ids, c.logprobs, advantage_of(i)) for i, c in enumerate(completions)]


def sequence_logprob(model, sample):
    batch = pad_samples([sample])
    with torch.no_grad():
        return float((token_logprobs(model, batch) * batch.completion_mask).sum())


def stepped_gradient(trainer) -> list:
    """The gradients each optimizer step of `trainer` steps with, recorded just before it (the
    trainer frees them right after the step)."""
    seen: list = []
    trainer.optimizer.register_step_pre_hook(lambda optimizer, *_: seen.append(torch.cat(
        [p.grad.flatten() for group in optimizer.param_groups for p in group["params"] if p.grad is not None])))
    return seen


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


def test_grad_norm_covers_every_optimizer_step_of_the_update(tiny_model, tokenizer):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: 1.0 if i % 2 == 0 else -1.0)
    trainer = Trainer(tiny_model, lr=5e-2, grad_clip=1e9, mini_batches_per_step=2, epochs_per_step=2)  # never clipped
    seen = stepped_gradient(trainer)
    metrics = trainer.update(samples, shuffle_seed=3)
    norms = [float(gradient.norm()) for gradient in seen]
    assert len(norms) == 4 and max(norms) - min(norms) > 1e-3 * max(norms)  # the steps' norms differ
    assert metrics.grad_norm == pytest.approx(sum(norms) / len(norms), rel=1e-5)  # not the first step's alone
    assert metrics.grad_norm_max == pytest.approx(max(norms), rel=1e-5)


def test_micro_batch_size_does_not_change_the_gradient(tiny_model, tokenizer):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: float(i % 3) - 1.0)
    grads = []
    for micro_batch_size in (1, 3, 8):
        trainer = Trainer(tiny_model, lr=0.0, micro_batch_size=micro_batch_size, grad_clip=1e9)
        stepped = stepped_gradient(trainer)
        trainer.update(samples)
        grads.append(stepped[0])
    assert torch.allclose(grads[0], grads[1], atol=1e-6) and torch.allclose(grads[0], grads[2], atol=1e-6)


def test_kl_metric_is_the_k3_of_the_policy_against_its_reference(tiny_model, tokenizer):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: 1.0 if i == 0 else -1.0 / 7)
    trainer = Trainer(tiny_model, lr=1e-2, kl_coef=0.1)
    # policy == reference: ref - new = 0 on every token -> k3 = e^0 - 0 - 1 = 0 exactly
    assert trainer.update(samples).kl == 0.0
    # second update, one optimizer step: kl = token mean of k3 = e^d - d - 1, d = ref - new, of the
    # weights it starts from (the loss is evaluated before the step), computed here apart
    batch = pad_samples(samples)
    with torch.no_grad():
        delta = token_logprobs(trainer.reference_model, batch) - token_logprobs(tiny_model, batch)
    k3 = (torch.exp(delta) - delta - 1.0) * batch.completion_mask
    expected = float(k3.sum() / batch.completion_mask.sum())
    assert expected > 1e-6  # the policy did move away from the frozen reference
    assert trainer.update(samples).kl == pytest.approx(expected, rel=1e-4)
    names = [name for name, _ in trainer.named_weights()]
    assert names == [name for name, _ in tiny_model.named_parameters()]


def test_optimizer_state_round_trip_gives_the_same_next_step(tiny_model, tokenizer):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: 1.0 if i % 2 == 0 else -1.0)
    trainer = Trainer(tiny_model, lr=1e-2, mini_batches_per_step=2)
    trainer.update(samples, shuffle_seed=1)
    state = copy.deepcopy(trainer.state_dict())
    restored_model = copy.deepcopy(tiny_model)
    restored = Trainer(restored_model, lr=1e-2, mini_batches_per_step=2)
    restored.load_state_dict(state)
    saved, loaded = state["state"], restored.state_dict()["state"]
    assert saved.keys() == loaded.keys() and len(saved) == len(list(tiny_model.parameters()))
    for key in saved:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(saved[key][name], loaded[key][name]), (key, name)
    assert any(float(saved[key]["exp_avg_sq"].abs().sum()) > 0 for key in saved)  # a real, non-zero state
    # the restored trainer takes the same next step, bit for bit; a fresh optimizer does not
    fresh_model = copy.deepcopy(tiny_model)
    trainer.update(samples, shuffle_seed=2)
    restored.update(samples, shuffle_seed=2)
    Trainer(fresh_model, lr=1e-2, mini_batches_per_step=2).update(samples, shuffle_seed=2)
    assert all(torch.equal(a, b) for a, b in zip(tiny_model.parameters(), restored_model.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(tiny_model.parameters(), fresh_model.parameters()))


@pytest.mark.parametrize("temperature", [0.5, 0.7, 1.0, 1.3])
def test_ratio_of_an_unchanged_policy_is_one_at_the_sampling_temperature(tiny_model, tokenizer, temperature):
    prompts = (("a", "1+2="), ("b", "reverse ab="), ("c", "reverse hello="))
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: 1.0, temperature, prompts)
    batch = pad_samples(samples)
    with torch.no_grad():
        new = token_logprobs(tiny_model, batch, temperature)
    ratio = torch.exp(new - batch.old_logprobs)[batch.completion_mask.bool()]
    assert ratio.numel() == sum(len(s.token_ids) for s in samples)
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5), ratio
    if temperature != 1.0:  # at temperature 1 the trainer would see another policy
        with torch.no_grad():
            at_one = torch.exp(token_logprobs(tiny_model, batch) - batch.old_logprobs)[batch.completion_mask.bool()]
        assert (at_one - 1.0).abs().max() > 1e-3


def test_policy_gradient_through_tempered_logprobs_by_hand():
    # One token, vocabulary of 3, logits z = [1, 0, -1], target 0, T = 0.7.
    # z / T = [1.4285714, 0, -1.4285714]; exp = [4.1727339, 1, 0.2396510]; sum S = 5.4123849
    # p = softmax(z / T) = [0.7709603, 0.1847614, 0.0442783]; log p_0 = 1.4285714 - ln 5.4123849 = -0.2601184
    # old logprob = log p_0 - ln 1.1 -> ratio 1.1 (inside the clip range 0.8..1.2), A = 1, one token:
    # loss = -ratio * A = -1.1; d loss / d log p_0 = -ratio * A = -1.1
    # d log p_0 / d z_j = (1[j = 0] - p_j) / T = [0.3271996, -0.2639449, -0.0632547]
    # d loss / d z = -1.1 * that = [-0.3599195, 0.2903394, 0.0695801]
    logits = torch.tensor([[[1.0, 0.0, -1.0]]], requires_grad=True)
    new = logprobs_of_targets(logits, torch.tensor([[0]]), temperature=0.7)
    assert new.item() == pytest.approx(-0.2601184, abs=1e-6)
    old = new.detach() - math.log(1.1)
    loss, metrics = policy_loss(new, old, torch.tensor([1.0]), torch.ones(1, 1), clip_eps=0.2)
    assert loss.item() == pytest.approx(-1.1, abs=1e-6) and metrics.clip_frac == 0.0
    loss.backward()
    assert logits.grad[0, 0].tolist() == pytest.approx([-0.3599195, 0.2903394, 0.0695801], abs=1e-6)


def test_token_logprobs_match_a_full_log_softmax_on_completion_columns(tiny_model, tokenizer):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: 1.0, 0.7, (("a", "1+2="), ("b", "reverse hello=")))
    batch = pad_samples(samples)
    with torch.no_grad():
        cheap = token_logprobs(tiny_model, batch, 0.7)
        logits = tiny_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
        full = torch.log_softmax(logits / 0.7, dim=-1).gather(2, batch.targets[:, :, None])[:, :, 0]
    mask = batch.completion_mask.bool()
    assert cheap.shape == full.shape and torch.allclose(cheap[mask], full[mask], atol=1e-5)


def test_shuffled_mini_batches_are_seeded_and_replay_bit_for_bit(tiny_model, tokenizer):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: float(i % 3) - 1.0)

    def weights_after(seed, global_seed):
        model = copy.deepcopy(tiny_model)
        torch.manual_seed(global_seed)  # the global RNG must not matter
        Trainer(model, lr=1e-2, mini_batches_per_step=4, epochs_per_step=2).update(samples, shuffle_seed=seed)
        return [p.detach().clone() for p in model.parameters()]

    first = weights_after(seed=7, global_seed=0)
    assert all(torch.equal(a, b) for a, b in zip(first, weights_after(seed=7, global_seed=123)))
    assert not all(torch.equal(a, b) for a, b in zip(first, weights_after(seed=8, global_seed=0)))
    assert not all(torch.equal(a, b) for a, b in zip(first, weights_after(seed=None, global_seed=0)))


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


def test_truncated_importance_sampling_uses_the_trainers_own_logprobs(tiny_model, tokenizer):
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: 1.0)
    tokens = sum(len(s.token_ids) for s in samples)
    # engine and trainer are the same fp32 model here: weights exp(trainer - engine) = 1 (to
    # float rounding), nothing capped, and the loss is -ratio * A * w = -1 per token
    metrics = Trainer(copy.deepcopy(tiny_model), lr=0.0, tis_cap=2.0).update(samples)
    assert metrics.tis_weight == pytest.approx(1.0, abs=1e-5) and metrics.tis_capped_frac == 0.0
    assert metrics.loss == pytest.approx(-1.0, abs=1e-5) and metrics.tokens == tokens
    # an engine whose logprobs are ln 3 lower on every token (other numerics): without TIS the
    # ratio against them is exp(ln 3) = 3, clipped at 1.2 -> loss -1.2 per token, all clipped;
    # with TIS the ratio is against the trainer's own logprobs (1) and the weight min(3, 2) = 2
    # -> loss -1 * 1 * 2 = -2 per token, every token capped
    skewed = [dataclasses.replace(s, old_logprobs=tuple(lp - math.log(3.0) for lp in s.old_logprobs)) for s in samples]
    plain = Trainer(copy.deepcopy(tiny_model), lr=0.0).update(skewed)
    assert plain.loss == pytest.approx(-1.2, abs=1e-5) and plain.clip_frac == 1.0
    # without TIS the metrics are exactly the fields they always were
    assert type(plain) is UpdateMetrics and set(plain.as_floats()) == {"loss", "kl", "grad_norm", "grad_norm_max", "clip_frac", "tokens"}
    capped = Trainer(copy.deepcopy(tiny_model), lr=0.0, tis_cap=2.0).update(skewed)
    assert isinstance(capped, TisUpdateMetrics) and {"tis_weight", "tis_capped_frac"} <= set(capped.as_floats())
    assert capped.tis_weight == pytest.approx(2.0) and capped.tis_capped_frac == 1.0
    assert capped.loss == pytest.approx(-2.0, abs=1e-4) and capped.clip_frac == 0.0


def test_tis_old_logprobs_are_taken_before_the_first_optimizer_step(tiny_model, tokenizer):
    # two mini-batches: the second one's ratio is against the logprobs from BEFORE the first
    # step (the policy version the step starts from), so it is no longer 1 and clips appear
    samples = samples_from_engine(tiny_model, tokenizer, lambda i: 1.0 if i % 2 == 0 else -1.0)
    trainer = Trainer(tiny_model, lr=0.5, tis_cap=2.0, mini_batches_per_step=2)
    metrics = trainer.update(samples)
    assert metrics.clip_frac > 0 and metrics.tis_weight == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match="tis_cap"):
        Trainer(tiny_model, lr=1e-2, tis_cap=0.0)


def test_an_episode_example_trains_its_replies_and_not_the_tool_output_between_them(tiny_model, tokenizer):
    """(prompt, segments): one sequence whose loss is on the trained segments and EOS only,
    each reply scored given the context before it, as the pair (context, reply) scores it."""
    from rlpipe.rl.batching import pad_samples, token_logprobs
    from rlpipe.rl.warmstart import _encode

    sample = _encode(tokenizer, "ab", (("cd", True), ("ef", False), ("gh", True)))
    ids = lambda text: tuple(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    assert sample.prompt_token_ids == ids("ab")
    assert sample.token_ids == ids("cd") + ids("ef") + ids("gh") + (tokenizer.eos_token_id,)
    assert sample.loss_mask == (1,) * len(ids("cd")) + (0,) * len(ids("ef")) + (1,) * len(ids("gh")) + (1,)
    assert _encode(tokenizer, "ab", "cd").loss_mask is None  # a plain answer: every token trained
    tiny_model.eval()
    with torch.no_grad():
        packed = pad_samples([sample], 0, "cpu")
        packed_logprobs = token_logprobs(tiny_model, packed)[0][packed.completion_mask[0] > 0]
        pair = pad_samples([_encode(tokenizer, "abcdef", "gh")], 0, "cpu")
        pair_logprobs = token_logprobs(tiny_model, pair)[0][pair.completion_mask[0] > 0]
    # the last reply and EOS: the same log-probabilities in both forms
    assert torch.allclose(packed_logprobs[-3:], pair_logprobs, atol=1e-5)
    losses = warm_start(tiny_model, tokenizer, [("ab", (("cd", True), ("ef", False), ("gh", True)))], steps=3, batch_size=2,
                        lr=1e-3, seed=0)
    assert len(losses) == 3 and all(loss > 0 for loss in losses)
