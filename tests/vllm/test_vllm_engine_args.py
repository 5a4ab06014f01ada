"""VLLMEngine's argument checks, which run before vllm is imported (so in every venv)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlpipe.core.errors import ModelNotFoundError
from rlpipe.engines.vllm import VLLMEngine, checked_weights, prompt_seed
from rlpipe.rl.policy import build_char_tokenizer, build_tiny_model


def save_policy(folder: Path, hidden_size: int, num_heads: int) -> Path:
    tokenizer = build_char_tokenizer()
    build_tiny_model("qwen2", len(tokenizer), hidden_size, 1, num_heads, 64, 64, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_head_size_vllm_cpu_cannot_run_is_refused_with_the_supported_ones(tmp_path):
    folder = save_policy(tmp_path, hidden_size=64, num_heads=4)  # 64 / 4 = head size 16
    with pytest.raises(ValueError, match=r"head size is 16 .* supports \(32, 64"):
        VLLMEngine(folder, tokenizer=build_char_tokenizer())


def test_sleep_mode_is_refused_on_cpu(tmp_path):
    folder = save_policy(tmp_path, hidden_size=128, num_heads=4)
    with pytest.raises(ValueError, match="enable_sleep_mode needs a CUDA device"):
        VLLMEngine(folder, tokenizer=build_char_tokenizer(), enable_sleep_mode=True)


def test_bad_folder_device_and_dtype_are_refused(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        VLLMEngine(tmp_path, tokenizer=build_char_tokenizer())
    folder = save_policy(tmp_path / "policy", hidden_size=128, num_heads=4)
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        VLLMEngine(folder, tokenizer=build_char_tokenizer(), device="cuda:1")
    with pytest.raises(ValueError, match="float32.*bfloat16"):
        VLLMEngine(folder, tokenizer=build_char_tokenizer(), dtype="float16")


def test_lora_weights_are_refused_before_any_reload():
    with pytest.raises(ValueError, match="merge_and_unload"):
        checked_weights([("model.embed_tokens.weight", torch.zeros(2)), ("q_proj.lora_B.default.weight", torch.zeros(2))])
    with pytest.raises(ValueError, match="no tensors"):
        checked_weights([])


def test_prompt_seeds_differ_between_prompts_and_call_seeds():
    # vLLM seeds sample j of a prompt with seed + j: per-prompt seeds must not be consecutive integers
    seeds = {prompt_seed(call_seed, index) for call_seed in range(4) for index in range(64)}
    assert len(seeds) == 4 * 64
    assert all(0 <= seed < 2**30 for seed in seeds)
    assert prompt_seed(3, 5) == prompt_seed(3, 5)
