"""Log-probs through the LM head in chunks (rl/chunked_logprobs.py) against the model's own
logits: the same values, the same loss and the same gradients, on tiny models."""

import pytest
import torch

from rlpipe.rl.batching import TrainSample, pad_samples, token_logprobs
from rlpipe.rl.chunked_logprobs import chunked_target_logprobs, supports_chunked_logprobs
from rlpipe.rl.losses import policy_loss
from rlpipe.rl.policy import build_tiny_model
from rlpipe.rl.trainer import Trainer

VOCAB = 37


def tiny(architecture="qwen2", dtype="float32", seed=0):
    return build_tiny_model(architecture, VOCAB, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                            max_position_embeddings=64, seed=seed, dtype=dtype)


def samples(count=7, seed=0):
    """Prompts and completions of different lengths (right padding, a ragged first completion
    column), advantages of both signs."""
    generator = torch.Generator().manual_seed(seed)
    result = []
    for index in range(count):
        prompt = torch.randint(3, VOCAB, (2 + index % 4,), generator=generator).tolist()
        completion = torch.randint(3, VOCAB, (1 + (index * 3) % 5,), generator=generator).tolist()
        logprobs = (-torch.rand(len(completion), generator=generator) * 3).tolist()
        result.append(TrainSample(tuple(prompt), tuple(completion), tuple(logprobs), 1.0 if index % 2 else -0.5))
    return result


def gradients(model, chunk_positions, temperature, batch):
    model.zero_grad(set_to_none=True)
    logprobs = token_logprobs(model, batch, temperature, chunk_positions=chunk_positions)
    loss, _ = policy_loss(logprobs, batch.old_logprobs, batch.advantages, batch.completion_mask, 0.2)
    loss.backward()
    return logprobs.detach(), loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_positions", [1, 5, 10_000])
def test_chunked_logprobs_loss_and_gradients_equal_the_plain_ones(architecture, temperature, chunk_positions):
    model = tiny(architecture)
    assert supports_chunked_logprobs(model)
    batch = pad_samples(samples())
    plain_logprobs, plain_loss, plain_grads = gradients(model, 0, temperature, batch)
    logprobs, loss, grads = gradients(model, chunk_positions, temperature, batch)
    mask = batch.completion_mask.bool()
    assert torch.allclose(logprobs[mask], plain_logprobs[mask], atol=1e-6, rtol=0)
    assert torch.equal(logprobs == 0, plain_logprobs == 0)  # the same columns left at 0 (before the first completion one)
    assert torch.allclose(loss, plain_loss, atol=1e-6, rtol=0)
    assert grads.keys() == plain_grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, plain_grads[name], atol=1e-6, rtol=1e-5), name
    assert any(grad.abs().max() > 1e-3 for grad in grads.values())  # a gradient that could differ


def test_bfloat16_model_matches_its_plain_logprobs_to_bfloat16_rounding():
    model = tiny(dtype="bfloat16")
    batch = pad_samples(samples())
    plain_logprobs, _, plain_grads = gradients(model, 0, 0.7, batch)
    logprobs, _, grads = gradients(model, 3, 0.7, batch)
    mask = batch.completion_mask.bool()
    assert torch.allclose(logprobs[mask], plain_logprobs[mask], atol=1e-5, rtol=0)  # the same bf16 logits, then float32
    for name, grad in grads.items():
        assert grad.dtype == torch.bfloat16
        assert torch.allclose(grad.float(), plain_grads[name].float(), atol=2e-2, rtol=2e-2), name


def test_updates_with_chunked_logprobs_step_the_weights_the_plain_updates_do():
    # llama: no k_proj bias, whose gradient is 0 up to rounding (a key bias shifts every score of
    # a query alike) and which AdamW would blow up from rounding noise to full steps
    plain, chunked = tiny("llama", seed=1), tiny("llama", seed=1)
    batch = samples(count=9, seed=3)
    for model, chunk in ((plain, 0), (chunked, 4)):
        trainer = Trainer(model, lr=1e-2, micro_batch_size=4, mini_batches_per_step=2, temperature=0.7,
                          logprob_chunk_positions=chunk)
        for step in range(2):
            trainer.update(batch, shuffle_seed=step)
    moved = False
    for (name, weight), (_, other) in zip(plain.named_parameters(), chunked.named_parameters()):
        assert torch.allclose(weight, other, atol=1e-5, rtol=0), name
    for weight, start in zip(plain.parameters(), tiny("llama", seed=1).parameters()):
        moved = moved or not torch.allclose(weight, start, atol=1e-4)
    assert moved


def test_unsupported_models_take_the_plain_path():
    model = tiny()
    model.config.model_type = "gemma2"  # logit soft-capping in its forward: its own logits only
    assert not supports_chunked_logprobs(model)
    batch = pad_samples(samples())
    with torch.no_grad():
        assert torch.equal(token_logprobs(model, batch, 0.7, chunk_positions=3), token_logprobs(model, batch, 0.7))


def test_chunk_size_must_be_positive():
    model = tiny()
    with pytest.raises(ValueError, match="chunk_positions"):
        chunked_target_logprobs(torch.zeros(2, 32), model.get_output_embeddings(), torch.zeros(2, dtype=torch.long), 1.0, 0)


def test_lora_adapter_gradients_equal_the_plain_ones():
    from rlpipe.rl.lora import apply_lora

    model = apply_lora(tiny("llama"), 4, 16.0, ("q_proj", "v_proj"))
    assert supports_chunked_logprobs(model)  # the peft wrapper reaches the base model's decoder and head
    batch = pad_samples(samples())
    plain_logprobs, _, plain_grads = gradients(model, 0, 0.7, batch)
    logprobs, _, grads = gradients(model, 3, 0.7, batch)
    assert grads.keys() == plain_grads.keys() and all("lora" in name for name in grads)
    assert torch.allclose(logprobs, plain_logprobs, atol=1e-6, rtol=0)
    for name, grad in grads.items():
        assert torch.allclose(grad, plain_grads[name], atol=1e-6, rtol=1e-5), name


def test_the_chunk_size_leaves_the_config_hash_alone():
    from rlpipe.core.config import load_config

    default = load_config(None, [])
    assert load_config(None, ["train.logprob_chunk_positions=0"]).config_hash() == default.config_hash()
    assert load_config(None, ["train.micro_batch_size=8"]).config_hash() != default.config_hash()
