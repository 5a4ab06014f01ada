"""LoRA policies: only the adapter trains and syncs, checkpoints hold the adapter, the
exported policy folder is the merged model, and a restore resumes bit for bit."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlpipe.engines.sampling import SamplingParams
from rlpipe.engines.hf import HFEngine
from rlpipe.rl.batching import TrainSample, pad_samples, token_logprobs
from rlpipe.rl.checkpoint import ADAPTER_FILE, CheckpointMeta, load_checkpoint, load_policy_weights, save_checkpoint
from rlpipe.rl.lora import apply_lora, is_lora_model
from rlpipe.rl.policy import build_tiny_model, load_local_model
from rlpipe.rl.trainer import Trainer
from tests.rl.test_trainer import stepped_gradient

TARGETS = ("q_proj", "v_proj", "down_proj")


def base_model(tokenizer):
    torch.set_num_threads(2)
    return build_tiny_model("qwen2", len(tokenizer), 32, 1, 2, 64, 64, seed=0)


def engine_samples(model_or_engine, tokenizer):
    engine = model_or_engine if isinstance(model_or_engine, HFEngine) else HFEngine(model_or_engine, tokenizer)
    params = SamplingParams(n=4, max_new_tokens=4, seed=0, temperature=1.0)
    completions = engine.generate([("a", "1+2="), ("b", "reverse ab=")], params)
    return [TrainSample(c.prompt_token_ids, c.token_ids, c.logprobs, 1.0 if i % 2 == 0 else -1.0)
            for i, c in enumerate(completions)]


def lora_trainer(model, **kwargs):
    return Trainer(model, lr=1e-2, lora_rank=4, lora_alpha=8.0, lora_target_modules=TARGETS, **kwargs)


def logits(model, ids=((5, 6, 7, 8, 9),)):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids)).logits


def test_only_the_adapter_trains_and_syncs(tokenizer):
    model = base_model(tokenizer)
    samples = engine_samples(model, tokenizer)
    base_before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = lora_trainer(model)
    assert is_lora_model(trainer.model)
    adapter = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
    # 3 target modules x (lora_A, lora_B) in the one layer
    assert len(adapter) == 6 and all(".lora_A." in name or ".lora_B." in name for name in adapter)
    metrics = trainer.update(samples)
    assert metrics.grad_norm > 0
    # the optimizer holds state for the 6 adapter tensors only
    assert len(trainer.optimizer.state) == 6
    assert sum(p.numel() for group in trainer.optimizer.param_groups for p in group["params"]) == sum(
        p.numel() for p in trainer.model.parameters() if p.requires_grad)
    # base weights did not move (peft renames a wrapped linear's weight to base_layer.weight)
    after = {name.replace("base_model.model.", "", 1).replace(".base_layer", ""): p
             for name, p in trainer.model.named_parameters() if not p.requires_grad}
    assert after.keys() == base_before.keys()
    assert all(torch.equal(base_before[name], after[name]) for name in base_before)
    # lora_B starts at zero; the update moved it
    assert any(float(p.detach().abs().sum()) > 0 for name, p in trainer.model.named_parameters() if ".lora_B." in name)
    # the synced tensors are the adapter's, by names a same-wrapped engine copy loads
    synced = dict(trainer.named_weights())
    assert synced.keys() == adapter
    engine = HFEngine(apply_lora(base_model(tokenizer), 4, 8.0, TARGETS), tokenizer)  # its own random lora_A
    assert not logprobs_agree(engine_samples(engine, tokenizer), trainer.model)
    engine.load_weights(iter(synced.items()), policy_version=1)
    assert logprobs_agree(engine_samples(engine, tokenizer), trainer.model)


def logprobs_agree(samples, model) -> bool:
    """The engine's sampled-token logprobs equal the model's recomputation of them."""
    batch = pad_samples(samples)
    with torch.no_grad():
        ours = token_logprobs(model, batch)[batch.completion_mask.bool()]
    return torch.allclose(ours, batch.old_logprobs[batch.completion_mask.bool()], atol=1e-5)


def test_lora_without_a_matching_module_is_refused(tokenizer):
    with pytest.raises(ValueError, match="none of the LoRA target modules"):
        Trainer(base_model(tokenizer), lr=1e-2, lora_rank=4, lora_target_modules=("c_attn",))


def test_checkpoint_exports_the_merged_model_and_keeps_the_adapter(tokenizer, tmp_path):
    model = base_model(tokenizer)
    trainer = lora_trainer(model)
    trainer.update(engine_samples(model, tokenizer))
    save_checkpoint(tmp_path, trainer.model, tokenizer, trainer.state_dict(), CheckpointMeta(1, 1, "h"))
    # the step folder: a plain HF folder (no peft at its top) that gives the adapter model's logits
    names = sorted(path.name for path in tmp_path.iterdir())
    assert "adapter_config.json" not in names and "model.safetensors" in names
    merged = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True)
    assert not is_lora_model(merged) and not any("lora" in name for name, _ in merged.named_parameters())
    assert torch.allclose(logits(merged), logits(trainer.model), atol=1e-5)
    loaded, _ = load_local_model(tmp_path)
    assert torch.allclose(logits(loaded), logits(trainer.model), atol=1e-5)
    # the trainer's model is still base + adapter (the merge worked on a copy)
    assert is_lora_model(trainer.model) and (tmp_path / ADAPTER_FILE).is_file()
    config = json.loads((Path(tmp_path) / ADAPTER_FILE).with_name("adapter_config.json").read_text())
    assert config["r"] == 4 and sorted(config["target_modules"]) == sorted(TARGETS)


def test_lora_checkpoint_round_trip_resumes_exactly(tokenizer, tmp_path):
    model = base_model(tokenizer)
    samples = engine_samples(model, tokenizer)
    trainer = lora_trainer(model)
    trainer.update(samples, shuffle_seed=1)
    save_checkpoint(tmp_path, trainer.model, tokenizer, trainer.state_dict(), CheckpointMeta(1, 1, "h"))
    # a restore: the base rebuilt from its source (same seed), the adapter and optimizer from the checkpoint
    restored = lora_trainer(base_model(tokenizer))
    assert not torch.equal(logits(restored.model), logits(trainer.model))
    meta, state = load_checkpoint(tmp_path, restored.model)
    restored.load_state_dict(state)
    assert meta == CheckpointMeta(1, 1, "h")
    assert torch.equal(logits(restored.model), logits(trainer.model))
    trainer.update(samples, shuffle_seed=2), restored.update(samples, shuffle_seed=2)
    assert all(torch.equal(a, b) for a, b in zip(trainer.model.parameters(), restored.model.parameters()))
    # a fresh optimizer on the same adapter takes another step
    fresh = lora_trainer(base_model(tokenizer))
    load_checkpoint(tmp_path, fresh.model)
    fresh.update(samples, shuffle_seed=2)
    assert not all(torch.equal(a, b) for a, b in zip(trainer.model.parameters(), fresh.model.parameters()))


def test_lora_reference_loads_the_adapter_and_mismatches_are_refused(tokenizer, tmp_path):
    model = base_model(tokenizer)
    trainer = lora_trainer(model, kl_coef=0.1)
    trainer.update(engine_samples(model, tokenizer))
    save_checkpoint(tmp_path, trainer.model, tokenizer, trainer.state_dict(), CheckpointMeta(0, 0, "h"))
    reference = lora_trainer(base_model(tokenizer), kl_coef=0.1).reference_model
    load_policy_weights(tmp_path, reference)  # what a restore does for the KL anchor
    assert torch.equal(logits(reference), logits(trainer.model))
    other_rank = Trainer(base_model(tokenizer), lr=1e-2, lora_rank=2, lora_target_modules=TARGETS)
    with pytest.raises(ValueError, match="does not match"):
        load_checkpoint(tmp_path, other_rank.model)
    plain = tmp_path / "plain"
    save_checkpoint(plain, base_model(tokenizer), tokenizer, {}, CheckpointMeta(0, 0, "h"))
    with pytest.raises(ValueError, match="no LoRA adapter"):
        load_checkpoint(plain, lora_trainer(base_model(tokenizer)).model)


def test_lora_on_a_bf16_base_with_checkpointing(tokenizer, tmp_path):
    # the adapter is fp32 on a bf16 base (peft), so it needs no master copy; activation
    # checkpointing gives the same adapter gradient as without it
    fp32 = base_model(tokenizer)
    samples = engine_samples(fp32, tokenizer)
    grads = []
    for checkpointing in (False, True):
        bf16 = build_tiny_model("qwen2", len(tokenizer), 32, 1, 2, 64, 64, seed=0, dtype="bfloat16")
        trainer = lora_trainer(bf16, gradient_checkpointing=checkpointing)
        stepped = stepped_gradient(trainer)
        trainer.update(samples)
        assert {tensor.dtype for _, tensor in trainer.named_weights()} == {torch.float32}
        assert "rlpipe_fp32_master_weights" not in trainer.state_dict()
        grads.append(stepped[0])
    assert grads[0].numel() > 0 and torch.allclose(grads[0], grads[1], atol=1e-6)
    save_checkpoint(tmp_path, trainer.model, tokenizer, trainer.state_dict(), CheckpointMeta(1, 1, "h"))
    merged, _ = load_local_model(tmp_path, dtype="bfloat16")
    assert torch.allclose(logits(merged).float(), logits(trainer.model).float(), atol=0.05)
    with pytest.raises(ValueError, match="pass the peft model"):
        save_checkpoint(tmp_path / "base", trainer.model.get_base_model(), tokenizer, {}, CheckpointMeta(1, 1, "h"))
