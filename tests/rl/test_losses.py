"""The clipped policy loss and its KL term, with hand-computed numbers."""

import math

import pytest
import torch

from rlpipe.rl.losses import policy_loss


def tensors(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_ratio_one_gives_minus_advantage_per_token():
    # new == old -> ratio 1 -> each token -1 * A = -2; token_mean = (-2 - 2) / 2 = -2
    logprobs = tensors([-1.0, -0.5])
    loss, metrics = policy_loss(logprobs, logprobs.clone(), torch.tensor([2.0]), tensors([1.0, 1.0]), clip_eps=0.2)
    assert loss.item() == pytest.approx(-2.0)
    assert metrics.clip_frac == 0.0 and metrics.kl == 0.0 and metrics.tokens == 2


def test_positive_advantage_clipped_above():
    # token 1: ratio = exp(ln 1.5) = 1.5, A = 1: min(1.5 * 1, clip(1.5, 0.8, 1.2) * 1) = 1.2 -> loss -1.2 (clipped: no gradient)
    # token 2: ratio 1 -> loss -1; token_mean = (-1.2 - 1) / 2 = -1.1; clip_frac = 1 clipped of 2 tokens = 0.5
    old = tensors([-2.0, -1.0])
    new = (old + torch.tensor([[math.log(1.5), 0.0]])).requires_grad_()
    loss, metrics = policy_loss(new, old, torch.tensor([1.0]), tensors([1.0, 1.0]), clip_eps=0.2)
    assert loss.item() == pytest.approx(-1.1)
    assert metrics.clip_frac == pytest.approx(0.5)
    loss.backward()
    # d loss / d new_1 = 0 (clipped); d loss / d new_2 = -ratio * A / 2 tokens = -0.5
    assert new.grad.tolist() == [[pytest.approx(0.0), pytest.approx(-0.5)]]


def test_negative_advantage_clipped_below():
    # ratio = 0.5, A = -1: unclipped 0.5 * -1 = -0.5; clipped 0.8 * -1 = -0.8; min = -0.8 -> loss +0.8, clipped
    old = tensors([-1.0])
    new = old + math.log(0.5)
    loss, metrics = policy_loss(new, old, torch.tensor([-1.0]), tensors([1.0]), clip_eps=0.2)
    assert loss.item() == pytest.approx(0.8)
    assert metrics.clip_frac == 1.0


def test_ratio_outside_range_on_the_helpful_side_is_not_clipped():
    # ratio = 0.5, A = +1: min(0.5, 0.8) = 0.5 -> loss -0.5, the unclipped branch binds -> clip_frac 0
    old = tensors([-1.0])
    loss, metrics = policy_loss(old + math.log(0.5), old, torch.tensor([1.0]), tensors([1.0]), clip_eps=0.2)
    assert loss.item() == pytest.approx(-0.5)
    assert metrics.clip_frac == 0.0


def test_k3_kl_term():
    # ref - new = ln 2 -> k3 = exp(ln 2) - ln 2 - 1 = 2 - 0.693147 - 1 = 0.306853
    # A = 0 -> policy term 0; loss = kl_coef * k3 = 0.1 * 0.306853 = 0.0306853
    new = tensors([-2.0])
    loss, metrics = policy_loss(new, new.clone(), torch.tensor([0.0]), tensors([1.0]), 0.2, ref_logprobs=new + math.log(2.0), kl_coef=0.1)
    assert metrics.kl == pytest.approx(0.306853, abs=1e-6)
    assert loss.item() == pytest.approx(0.0306853, abs=1e-7)


def test_kl_is_zero_when_policy_equals_reference():
    new = tensors([-2.0, -0.1])
    loss, metrics = policy_loss(new, new, torch.tensor([0.0]), tensors([1.0, 1.0]), 0.2, ref_logprobs=new, kl_coef=1.0)
    assert loss.item() == 0.0 and metrics.kl == 0.0


def test_mask_and_aggregations():
    # seq 1: A = 1, two tokens, ratio 1 -> token losses -1, -1 (sum -2)
    # seq 2: A = -2, one real token (second is padding) -> token loss +2 (sum 2)
    # token_mean = (-1 - 1 + 2) / 3 tokens = 0; seq_mean_token_sum = (-2 + 2) / 2 seqs = 0
    # make it asymmetric: A2 = -4 -> token_mean = (-2 + 4) / 3 = 0.6667; seq_mean_token_sum = (-2 + 4) / 2 = 1
    logprobs = tensors([-1.0, -1.0], [-0.3, -9.0])
    mask = tensors([1.0, 1.0], [1.0, 0.0])
    advantages = torch.tensor([1.0, -4.0])
    token_mean, metrics = policy_loss(logprobs, logprobs, advantages, mask, 0.2, loss_agg="token_mean")
    seq_mean, _ = policy_loss(logprobs, logprobs, advantages, mask, 0.2, loss_agg="seq_mean_token_sum")
    assert token_mean.item() == pytest.approx(2 / 3)
    assert seq_mean.item() == pytest.approx(1.0)
    assert metrics.tokens == 3


def test_normalizer_makes_micro_batches_sum_to_full_batch():
    torch.manual_seed(0)
    new, old = torch.randn(4, 3), torch.randn(4, 3)
    mask = tensors([1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1])
    advantages = torch.tensor([1.0, -0.5, 2.0, -1.0])
    full, _ = policy_loss(new, old, advantages, mask, 0.2)
    parts = [policy_loss(new[s], old[s], advantages[s], mask[s], 0.2, normalizer=float(mask.sum()))[0] for s in (slice(0, 1), slice(1, 4))]
    assert (parts[0] + parts[1]).item() == pytest.approx(full.item())


def test_unknown_aggregation_raises():
    with pytest.raises(ValueError, match="loss_agg"):
        policy_loss(tensors([0.0]), tensors([0.0]), torch.tensor([1.0]), tensors([1.0]), 0.2, loss_agg="sum")


def test_tis_caps_the_weight_of_a_token_the_engine_found_less_likely():
    # trainer (old) logprobs [-1, -1]; the engine's (behaviour) are lower by ln 3 and ln 1.5:
    # raw weights exp(old - behaviour) = [3, 1.5]; cap 2 -> w = [2, 1.5], token 1 capped
    # new == old -> ratio 1, A = 1: pg = [-1 * 2, -1 * 1.5]; token_mean = (-2 - 1.5) / 2 = -1.75
    # tis_weight = (2 + 1.5) / 2 = 1.75; tis_capped_frac = 1 of 2 tokens = 0.5
    old = tensors([-1.0, -1.0])
    behaviour = old - torch.tensor([[math.log(3.0), math.log(1.5)]])
    new = old.clone().requires_grad_()
    loss, metrics = policy_loss(new, old, torch.tensor([1.0]), tensors([1.0, 1.0]), 0.2,
                                behaviour_logprobs=behaviour, tis_cap=2.0)
    assert loss.item() == pytest.approx(-1.75)
    assert metrics.tis_weight == pytest.approx(1.75) and metrics.tis_capped_frac == pytest.approx(0.5)
    loss.backward()
    # the weight is a constant: d loss / d new_t = -ratio * A * w_t / 2 tokens = [-1.0, -0.75]
    assert new.grad.tolist() == [[pytest.approx(-1.0), pytest.approx(-0.75)]]


def test_tis_weight_below_one_when_the_engine_found_the_token_more_likely():
    # behaviour = old + ln 2 -> w = exp(-ln 2) = 0.5 (a cap only bounds from above)
    # ratio 1, A = -2: pg = -(1 * -2) * 0.5 = 1.0
    old = tensors([-2.0])
    loss, metrics = policy_loss(old, old, torch.tensor([-2.0]), tensors([1.0]), 0.2,
                                behaviour_logprobs=old + math.log(2.0), tis_cap=2.0)
    assert loss.item() == pytest.approx(1.0)
    assert metrics.tis_weight == pytest.approx(0.5) and metrics.tis_capped_frac == 0.0


def test_tis_with_identical_logprobs_is_the_loss_without_it():
    # behaviour == old -> every weight exp(0) = 1: the same loss, gradient and metrics as
    # without TIS (ratios away from 1 here, so the clipped branch is exercised too)
    torch.manual_seed(0)
    old = torch.randn(3, 4)
    new_plain = (old + 0.3 * torch.randn(3, 4)).requires_grad_()
    new_tis = new_plain.detach().clone().requires_grad_()
    mask = tensors([1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1])
    advantages = torch.tensor([1.0, -0.5, 2.0])
    plain, plain_metrics = policy_loss(new_plain, old, advantages, mask, 0.2)
    with_tis, tis_metrics = policy_loss(new_tis, old, advantages, mask, 0.2, behaviour_logprobs=old.clone(), tis_cap=2.0)
    assert with_tis.item() == plain.item()
    plain.backward(), with_tis.backward()
    assert torch.equal(new_plain.grad, new_tis.grad)
    assert tis_metrics.tis_weight == 1.0 and tis_metrics.tis_capped_frac == 0.0
    assert tis_metrics.clip_frac == plain_metrics.clip_frac > 0
    assert plain_metrics.tis_weight is None and plain_metrics.tis_capped_frac is None


def test_tis_needs_both_behaviour_logprobs_and_a_cap():
    logprobs = tensors([-1.0])
    with pytest.raises(ValueError, match="both"):
        policy_loss(logprobs, logprobs, torch.tensor([1.0]), tensors([1.0]), 0.2, behaviour_logprobs=logprobs)
    with pytest.raises(ValueError, match="both"):
        policy_loss(logprobs, logprobs, torch.tensor([1.0]), tensors([1.0]), 0.2, tis_cap=2.0)


def test_k3_as_a_loss_has_the_gradient_of_kl_from_the_reference_not_to_it():
    # one position over 5 tokens: the expected gradient of the k3 loss under x ~ pi (every
    # token weighted by pi(x), exactly) is d KL(ref || pi), while its expected value is KL(pi || ref)
    logits = torch.tensor([0.3, -1.2, 2.0, 0.1, -0.4], dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.tensor([1.5, 0.2, -0.7, 0.4, 0.0], dtype=torch.float64), dim=0)
    pi = torch.log_softmax(logits, dim=0)
    expected_loss, expected_kl = torch.zeros((), dtype=torch.float64), 0.0
    for x in range(5):
        new = pi[x].reshape(1, 1)
        loss, metrics = policy_loss(new, new.detach(), torch.tensor([0.0]), torch.ones(1, 1, dtype=torch.float64), 0.2,
                                    ref_logprobs=ref[x].reshape(1, 1), kl_coef=1.0)
        expected_loss = expected_loss + pi[x].exp().detach() * loss
        expected_kl += float(pi[x].detach().exp()) * metrics.kl
    (k3_gradient,) = torch.autograd.grad(expected_loss, logits, retain_graph=True)
    (forward,) = torch.autograd.grad((ref.exp() * (ref - pi)).sum(), logits, retain_graph=True)  # KL(ref || pi)
    (reverse,) = torch.autograd.grad((pi.exp() * (pi - ref)).sum(), logits)  # KL(pi || ref)
    assert k3_gradient.tolist() == pytest.approx(forward.tolist(), abs=1e-12)
    assert float((k3_gradient - reverse).abs().max()) > 0.1  # far apart here: not the reverse KL's gradient
    assert expected_kl == pytest.approx(float((pi.exp() * (pi - ref)).sum().detach()), abs=1e-12)  # the value: KL(pi || ref)


def test_clip_higher_widens_the_upper_side_only():
    # ratio 1.25, A = +1: symmetric 0.2 clips at 1.2 (loss -1.2, no gradient); clip_eps_high 0.28
    # leaves it unclipped (loss -1.25, gradient -ratio * A = -1.25)
    old = tensors([-2.0])
    new = (old + math.log(1.25)).requires_grad_()
    symmetric, clipped = policy_loss(new, old, torch.tensor([1.0]), tensors([1.0]), clip_eps=0.2)
    assert symmetric.item() == pytest.approx(-1.2) and clipped.clip_frac == 1.0
    higher, unclipped = policy_loss(new, old, torch.tensor([1.0]), tensors([1.0]), clip_eps=0.2, clip_eps_high=0.28)
    assert higher.item() == pytest.approx(-1.25) and unclipped.clip_frac == 0.0
    higher.backward()
    assert new.grad.item() == pytest.approx(-1.25)
    # the lower side is still 1 - clip_eps: ratio 0.5, A = -1 -> clipped at 0.8, loss +0.8
    low, metrics = policy_loss(old + math.log(0.5), old, torch.tensor([-1.0]), tensors([1.0]), clip_eps=0.2, clip_eps_high=0.28)
    assert low.item() == pytest.approx(0.8) and metrics.clip_frac == 1.0
    # and ratio 1.3 > 1.28 is clipped at 1.28
    beyond, metrics = policy_loss(old + math.log(1.3), old, torch.tensor([1.0]), tensors([1.0]), clip_eps=0.2, clip_eps_high=0.28)
    assert beyond.item() == pytest.approx(-1.28) and metrics.clip_frac == 1.0


@pytest.mark.parametrize("clip_eps, clip_eps_high", [(0.0, None), (0.2, 0.0), (0.2, -0.1)])
def test_a_clip_range_without_width_is_refused(clip_eps, clip_eps_high):
    logprobs = tensors([-1.0])
    with pytest.raises(ValueError, match="clip range"):
        policy_loss(logprobs, logprobs, torch.tensor([1.0]), tensors([1.0]), clip_eps=clip_eps, clip_eps_high=clip_eps_high)
