"""The loss mask of multi-turn episodes: tool output (loss_mask 0) is context for the
policy's later tokens, but no term of the loss and no gradient comes from it."""

import torch

from rlpipe.rl.batching import TrainSample, completion_tokens, pad_samples, token_logprobs
from rlpipe.rl.losses import policy_loss
from rlpipe.rl.trainer import Trainer

# prompt, then: reply (3 tokens), tool output (4 tokens), reply (2 tokens)
PROMPT = (10, 11, 12)
REPLY_1, OUTPUT, REPLY_2 = (20, 21, 22), (30, 31, 32, 33), (23, 24)
MASK = (1, 1, 1, 0, 0, 0, 0, 1, 1)


def episode(output=OUTPUT, output_logprobs=(0.0,) * 4, trailing=(), advantage=1.0) -> TrainSample:
    tokens = REPLY_1 + output + REPLY_2 + trailing
    logprobs = (-1.0, -1.5, -2.0) + output_logprobs + (-0.5, -1.0) + (0.0,) * len(trailing)
    return TrainSample(PROMPT, tokens, logprobs, advantage, loss_mask=MASK + (0,) * len(trailing))


def gradient(model, samples) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    batch = pad_samples(samples)
    loss, _ = policy_loss(token_logprobs(model, batch), batch.old_logprobs, batch.advantages, batch.completion_mask, clip_eps=0.2)
    loss.backward()
    return torch.cat([parameter.grad.flatten() for parameter in model.parameters() if parameter.grad is not None])


def test_mask_marks_only_the_policy_tokens():
    batch = pad_samples([episode()])
    # column j predicts token j + 1: the completion starts at column len(PROMPT) - 1 = 2
    assert batch.completion_mask.tolist() == [[0, 0] + [1, 1, 1, 0, 0, 0, 0, 1, 1]]
    assert completion_tokens([episode()]) == 5  # the token-mean denominator counts replies only


def test_no_gradient_reaches_the_logprobs_of_tool_output(tiny_model):
    batch = pad_samples([episode()])
    logprobs = token_logprobs(tiny_model, batch)
    logprobs.retain_grad()
    loss, metrics = policy_loss(logprobs, batch.old_logprobs, batch.advantages, batch.completion_mask, clip_eps=0.2)
    loss.backward()
    grad = logprobs.grad[0]
    output_columns = range(2 + 3, 2 + 3 + 4)
    assert all(grad[column].item() == 0.0 for column in output_columns)
    assert all(grad[column].item() != 0.0 for column in (2, 3, 4, 9, 10))  # every reply token has a term
    assert metrics.tokens == 5


def test_gradient_does_not_depend_on_stored_tool_output_logprobs_or_trailing_output(tiny_model):
    base = gradient(tiny_model, [episode()])
    assert base.abs().sum() > 0
    # whatever logprobs a row stored on tool output, and whatever output follows the last reply
    changed = gradient(tiny_model, [episode(output_logprobs=(-9.0, 3.0, -0.1, 7.0))])
    trailing = gradient(tiny_model, [episode(trailing=(40, 41, 42, 43, 44))])
    assert torch.equal(base, changed)
    assert torch.allclose(base, trailing, atol=1e-7)


def test_gradient_equals_the_sum_over_reply_tokens_alone(tiny_model):
    # the same loss written by hand: -A * ratio on the five reply tokens, divided by 5
    batch = pad_samples([episode()])
    masked = gradient(tiny_model, [episode()])
    tiny_model.zero_grad(set_to_none=True)
    logprobs = token_logprobs(tiny_model, batch)[0]
    reply_columns = [2, 3, 4, 9, 10]
    ratios = torch.exp(logprobs[reply_columns] - batch.old_logprobs[0, reply_columns])
    (-(ratios * 1.0).sum() / 5).backward()  # A = 1 > 0 and every ratio < 1.2 here: the unclipped term is the min
    by_hand = torch.cat([parameter.grad.flatten() for parameter in tiny_model.parameters() if parameter.grad is not None])
    assert torch.allclose(masked, by_hand, atol=1e-6)


def test_trainer_update_ignores_tool_output_logprobs(tiny_model):
    import copy

    twin = copy.deepcopy(tiny_model)
    first = Trainer(tiny_model, lr=1e-2)
    second = Trainer(twin, lr=1e-2)
    metrics = first.update([episode(), episode(advantage=-1.0, output=(34, 35, 36, 37))])
    second.update([episode(output_logprobs=(-5.0,) * 4), episode(advantage=-1.0, output=(34, 35, 36, 37), output_logprobs=(2.0,) * 4)])
    assert metrics.tokens == 10
    for mine, theirs in zip(tiny_model.parameters(), twin.parameters()):
        assert torch.equal(mine, theirs)
