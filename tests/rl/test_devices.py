"""Devices, dtypes and memory of the policy and the trainer, on the CPU (no CUDA here: the
cuda paths are tested only through `resolve_device` with a given device count)."""

import copy

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from rlpipe.engines.sampling import SamplingParams
from rlpipe.engines.hf import HFEngine
from rlpipe.rl.batching import TrainSample, pad_samples, token_logprobs
from rlpipe.rl.policy import build_tiny_model, load_local_model, resolve_device, resolve_dtype
from rlpipe.rl.trainer import MASTER_WEIGHTS_KEY, Trainer
from tests.rl.test_trainer import stepped_gradient


def engine_samples(model, tokenizer, advantage_of, prompts=(("a", "1+2="), ("b", "reverse ab="))):
    params = SamplingParams(n=4, max_new_tokens=4, seed=0, temperature=1.0)
    completions = HFEngine(copy.deepcopy(model).float(), tokenizer).generate(list(prompts), params)
    return [TrainSample(c.prompt_token_ids, c.token_ids, c.logprobs, advantage_of(i)) for i, c in enumerate(completions)]


def tiny(tokenizer, dtype="float32", num_layers=1):
    torch.set_num_threads(2)
    return build_tiny_model("qwen2", len(tokenizer), 32, num_layers, 2, 64, 64, seed=0, dtype=dtype)


def test_resolve_device():
    assert resolve_device("auto", cuda_device_count=0) == torch.device("cpu")
    assert resolve_device("auto", cuda_device_count=2) == torch.device("cuda", 0)
    assert resolve_device("cpu", cuda_device_count=2) == torch.device("cpu")
    assert resolve_device("cuda", cuda_device_count=1) == torch.device("cuda", 0)
    assert resolve_device("cuda:1", cuda_device_count=2) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"'cuda:2'.*cuda:0\.\.cuda:1"):
        resolve_device("cuda:2", cuda_device_count=2)
    with pytest.raises(ValueError, match="no CUDA device"):
        resolve_device("cuda", cuda_device_count=0)
    for bad in ("tpu", "cuda:x", ""):
        with pytest.raises(ValueError, match="device"):
            resolve_device(bad, cuda_device_count=1)
    # this machine, asked for real: auto is whatever torch sees
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_resolve_dtype():
    assert resolve_dtype("float32") is torch.float32 and resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype(torch.bfloat16) is torch.bfloat16
    with pytest.raises(ValueError, match="float16"):
        resolve_dtype("float16")


def test_bf16_models_are_the_fp32_weights_cast(tokenizer, tmp_path):
    fp32, bf16 = tiny(tokenizer), tiny(tokenizer, "bfloat16")
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    assert all(torch.equal(a.to(torch.bfloat16), b) for a, b in zip(fp32.parameters(), bf16.parameters()))
    fp32.save_pretrained(tmp_path), tokenizer.save_pretrained(tmp_path)
    loaded, _ = load_local_model(tmp_path, device="cpu", dtype="bfloat16")
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert all(torch.equal(a, b) for a, b in zip(bf16.parameters(), loaded.parameters()))


def test_reference_model_exists_only_with_a_kl_term(tokenizer):
    model = tiny(tokenizer, "bfloat16")
    assert Trainer(model, lr=1e-3, kl_coef=0.0).reference_model is None
    assert Trainer(model, lr=1e-3, kl_coef=0.0, reference_model=copy.deepcopy(model)).reference_model is None
    reference = Trainer(model, lr=1e-3, kl_coef=0.1).reference_model
    assert reference is not None and reference is not model
    assert {p.dtype for p in reference.parameters()} == {torch.bfloat16}  # the reference honours the dtype
    assert not any(p.requires_grad for p in reference.parameters())


def test_trainer_casts_and_places_the_model_and_its_reference(tokenizer):
    model, reference = tiny(tokenizer), tiny(tokenizer)
    trainer = Trainer(model, lr=1e-3, kl_coef=0.1, reference_model=reference, device="cpu", dtype="bfloat16")
    assert trainer.model is model and trainer.reference_model is reference
    for owned in (model, reference):
        assert {(p.device.type, p.dtype) for p in owned.parameters()} == {("cpu", torch.bfloat16)}
    assert MASTER_WEIGHTS_KEY in trainer.state_dict()
    assert MASTER_WEIGHTS_KEY not in Trainer(tiny(tokenizer), lr=1e-3).state_dict()  # fp32: no copy


def test_bf16_training_keeps_fp32_master_weights(tokenizer):
    # AdamW's first step moves each weight by ~lr = 1e-5; a bf16 weight near 0.02 has a step of
    # 2^-6 * 2^-7 = 1.2e-4 there, so pure bf16 AdamW rounds most of these updates away. The
    # fp32 masters keep them, and the bf16 weights are always the masters rounded.
    model = tiny(tokenizer, "bfloat16")
    samples = engine_samples(model, tokenizer, lambda i: 1.0 if i % 2 == 0 else -1.0)
    initial = [p.detach().float().clone() for p in model.parameters()]
    trainer = Trainer(model, lr=1e-5)
    metrics = trainer.update(samples)
    assert metrics.grad_norm > 0 and {p.dtype for p in model.parameters()} == {torch.bfloat16}
    masters = trainer.state_dict()[MASTER_WEIGHTS_KEY]
    assert all(master.dtype == torch.float32 for master in masters)
    assert all(torch.equal(master.to(torch.bfloat16), p) for master, p in zip(masters, model.parameters()))
    moved = sum(int((master != start).sum()) for master, start in zip(masters, initial))
    moved_bf16 = sum(int((p.float() != start).sum()) for p, start in zip(model.parameters(), initial))
    assert moved > 2 * moved_bf16  # most updates are below bf16's resolution, yet the master has them
    # the optimizer state is fp32 too (AdamW's moments live next to the fp32 masters)
    assert {state["exp_avg"].dtype for state in trainer.optimizer.state.values()} == {torch.float32}


def test_bf16_master_weights_survive_a_state_round_trip(tokenizer):
    model = tiny(tokenizer, "bfloat16")
    samples = engine_samples(model, tokenizer, lambda i: 1.0 if i % 2 == 0 else -1.0)
    trainer = Trainer(model, lr=1e-4)
    trainer.update(samples)
    state = copy.deepcopy(trainer.state_dict())
    restored_model = copy.deepcopy(model)
    restored = Trainer(restored_model, lr=1e-4)
    restored.load_state_dict(state)
    trainer.update(samples), restored.update(samples)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), restored_model.parameters()))
    again = trainer.state_dict()[MASTER_WEIGHTS_KEY]
    assert all(torch.equal(a, b) for a, b in zip(again, restored.state_dict()[MASTER_WEIGHTS_KEY]))


def test_master_weights_follow_weights_changed_outside_the_trainer(tokenizer):
    model = tiny(tokenizer, "bfloat16")
    trainer = Trainer(model, lr=1e-4)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # e.g. a warm-start trained the policy in between
    trainer.update(engine_samples(model, tokenizer, lambda i: 0.0))  # no gradient: nothing trains
    masters = trainer.state_dict()[MASTER_WEIGHTS_KEY]
    assert torch.equal(masters[0].to(torch.bfloat16), next(model.parameters()))


def test_gradient_checkpointing_recomputes_layers_and_gives_the_same_gradient(tokenizer):
    model = tiny(tokenizer, num_layers=2)
    samples = engine_samples(model, tokenizer, lambda i: float(i % 3) - 1.0)
    grads, calls = [], []
    for checkpointing in (False, True):
        copy_ = copy.deepcopy(model)
        trainer = Trainer(copy_, lr=0.0, grad_clip=1e9, gradient_checkpointing=checkpointing)
        forwards = []
        # inside the layer (transformers checkpoints the layer's forward, its own hooks stay
        # outside), and a pre-hook (torch's recompute may stop before the MLP's forward ends)
        copy_.model.layers[0].mlp.register_forward_pre_hook(lambda *_: forwards.append(1))
        stepped = stepped_gradient(trainer)
        trainer.update(samples)
        calls.append(len(forwards))
        grads.append(stepped[0])
        assert copy_.config.use_cache is not checkpointing
    # one micro-batch: the layer's MLP runs once without checkpointing, and again in the backward with it
    assert calls == [1, 2]
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_update_logits_cover_only_the_completion_positions():
    # a 32k vocabulary, prompts of 300 and 295 tokens, completions of 3 and 5: rows of 303
    # tokens; a full-vocabulary fp32 tensor over every position is 2 x 303 x 32000 x 4 bytes =
    # 77.6 MB; the update's largest single allocation must stay far below it (the logits it
    # keeps are 2 x 9 x 32000 x 4 = 2.3 MB; the embedding's gradient is 32000 x 32 x 4 = 4.1 MB)
    torch.set_num_threads(2)
    vocab = 32000
    model = build_tiny_model("qwen2", vocab, 32, 1, 2, 64, 512, seed=0)
    samples = [TrainSample(tuple(range(5, 305)), (7, 8, 9), (-1.0,) * 3, 1.0),
               TrainSample(tuple(range(5, 300)), (7, 8, 9, 10, 11), (-1.0,) * 5, 1.0)]
    batch = pad_samples(samples)
    full_bytes = batch.input_ids.numel() * vocab * 4
    shapes = []
    model.lm_head.register_forward_hook(lambda module, args, output: shapes.append(tuple(output.shape)))

    def largest_allocation(work) -> int:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recorded:
            work()
        return max(event.self_cpu_memory_usage for event in recorded.events())

    ours = largest_allocation(lambda: token_logprobs(model, batch, 0.7).sum().backward())
    # 302 shifted columns; the first completion column is 294 (prompt of 295 tokens, column
    # j predicts token j + 1): positions 294..302 reach the LM head, 302 - 294 + 1 = 9
    assert shapes == [(2, 9, vocab)]
    assert ours < full_bytes / 8

    def full_log_softmax():  # what the update must not do; shows the measurement can fail
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
        torch.log_softmax(logits / 0.7, -1).gather(2, batch.targets[:, :, None]).sum().backward()

    assert largest_allocation(full_log_softmax) >= full_bytes * 302 / 303  # [2, 302, 32000] fp32
