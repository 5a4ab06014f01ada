"""Char tokenizer, tiny model builder and the local loader; a saved policy folder loads the
same through the standard transformers path (AutoTokenizer, AutoModelForCausalLM, pipeline)."""

import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

from rlpipe.core.errors import ModelNotFoundError
from rlpipe.engines.sampling import SamplingParams
from rlpipe.engines.hf import HFEngine
from rlpipe.envs.reverse import ReverseEnv
from rlpipe.rl.checkpoint import CheckpointMeta, save_checkpoint
from rlpipe.rl.policy import DEFAULT_ALPHABET, build_tiny_model, load_local_model
from rlpipe.rl.warmstart import warm_start

TEXT = "reverse abc=cba\n37+58=95 ?!"


def test_char_tokenizer_one_token_per_character(tokenizer):
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(TEXT)
    assert tokenizer.decode(ids) == TEXT
    assert tokenizer.decode(ids + [tokenizer.eos_token_id], skip_special_tokens=True) == TEXT
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (0, 1, 2)
    assert tokenizer("é")["input_ids"] == []  # outside the alphabet: dropped (as HF's Qwen2 rebuild does)
    assert tokenizer(" \n")["input_ids"] == [DEFAULT_ALPHABET.index(" ") + 4, DEFAULT_ALPHABET.index("\n") + 4]
    assert all(char in DEFAULT_ALPHABET for char in "0123456789+-*= \nabcxyz.,:?")


def test_tokenizer_round_trips_through_auto_tokenizer(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"]


PROMPT_WITH_SPACES = "reverse abc="  # 12 characters, 12 ids; an id per character, the space included


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_saved_policy_loads_the_same_through_auto_classes_and_pipeline(architecture, tokenizer, tmp_path, monkeypatch):
    """transformers 5 loads a qwen2 folder's tokenizer as a Qwen2Tokenizer rebuilt from the
    vocabulary; the policy folder must give the same ids and greedy answers that way too."""
    # transformers' pipeline() sets TOKENIZERS_PARALLELISM=false in os.environ when it is
    # unset: set here first, through monkeypatch, which puts the old state back afterwards
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", os.environ.get("TOKENIZERS_PARALLELISM", "false"))
    torch.manual_seed(0)
    model = build_tiny_model(architecture, len(tokenizer), 64, 2, 4, 128, 64, seed=0)
    env = ReverseEnv(max_word_len=3)
    train_tasks = env.tasks("train", 200, seed=0)
    warm_start(model, tokenizer, [(t.prompt, t.reference_answer) for t in train_tasks], steps=30, batch_size=32, lr=3e-3, seed=0)
    save_checkpoint(tmp_path, model, tokenizer, {}, CheckpointMeta(step=0, policy_version=0, config_hash="test"))
    folder = tmp_path
    assert sorted(path.name for path in folder.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "optimizer.pt", "rlpipe_checkpoint.json",
        "tokenizer.json", "tokenizer_config.json",
    ]  # what an HF user expects, with the trainer's state beside it (HF Trainer's layout)
    hf_tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(PROMPT_WITH_SPACES, add_special_tokens=False)["input_ids"]
    assert len(ids) == 12
    assert hf_tokenizer(PROMPT_WITH_SPACES, add_special_tokens=False)["input_ids"] == ids
    assert hf_tokenizer(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"]
    assert hf_tokenizer.decode(tokenizer(TEXT)["input_ids"]) == TEXT
    assert hf_tokenizer.padding_side == "left"

    prompts = [task.prompt for task in env.tasks("heldout", 8, seed=0)]
    greedy = SamplingParams(n=1, max_new_tokens=6, stop=("\n",), greedy=True)

    def answers(engine: HFEngine) -> list[str]:
        return [completion.text for completion in engine.generate([(str(i), p) for i, p in enumerate(prompts)], greedy)]

    trained = answers(HFEngine(model, tokenizer))
    ours = answers(HFEngine(*load_local_model(folder)))
    hf_model = AutoModelForCausalLM.from_pretrained(folder)
    plain = answers(HFEngine(hf_model, hf_tokenizer))
    generator = pipeline("text-generation", model=str(folder), device="cpu")
    piped = [
        output[0]["generated_text"].split("\n")[0]
        for output in generator(prompts, max_new_tokens=6, do_sample=False, return_full_text=False)
    ]
    assert any(trained), trained  # warm-started: real answers, not a comparison of empty strings
    assert ours == trained
    assert plain == trained
    assert piped == trained


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
