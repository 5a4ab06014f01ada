"""Char tokenizer, tiny model builder and the local loader."""

import pytest
import torch
from transformers import AutoTokenizer

from rlpipe.core.errors import ModelNotFoundError
from rlpipe.rl.policy import DEFAULT_ALPHABET, build_char_tokenizer, build_tiny_model, load_local_model

TEXT = "reverse abc=cba\n37+58=95 ?!"


def test_char_tokenizer_one_token_per_character(tokenizer):
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(TEXT)
    assert tokenizer.decode(ids) == TEXT
    assert tokenizer.decode(ids + [tokenizer.eos_token_id], skip_special_tokens=True) == TEXT
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (0, 1, 2)
    assert tokenizer("é")["input_ids"] == [tokenizer.unk_token_id]
    assert all(char in DEFAULT_ALPHABET for char in "0123456789+-*= \nabcxyz.,:?")


def test_tokenizer_round_trips_through_auto_tokenizer(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"]


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_tiny_model_is_seeded_float32_and_saves_and_loads(architecture, tokenizer, tmp_path):
    model = build_tiny_model(architecture, len(tokenizer), 32, 1, 2, 64, 32, seed=3)
    again = build_tiny_model(architecture, len(tokenizer), 32, 1, 2, 64, 32, seed=3)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded_model, loaded_tokenizer = load_local_model(tmp_path)
    assert loaded_tokenizer(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"]
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded_model(ids).logits, atol=1e-5)


def test_load_local_model_says_what_is_missing(tokenizer, tmp_path):
    with pytest.raises(ModelNotFoundError, match="not found"):
        load_local_model(tmp_path / "nope")
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_local_model(tmp_path)
    model = build_tiny_model("qwen2", len(tokenizer), 32, 1, 2, 64, 32, seed=0)
    model.config.save_pretrained(tmp_path)
    with pytest.raises(ModelNotFoundError, match="no weights"):
        load_local_model(tmp_path)
    model.save_pretrained(tmp_path)
    with pytest.raises(ModelNotFoundError, match="no tokenizer") as error:
        load_local_model(tmp_path)
    assert "save_pretrained" in error.value.hint


def test_bad_head_count_is_rejected(tokenizer):
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model("qwen2", len(tokenizer), 30, 1, 4, 64, 32, seed=0)
