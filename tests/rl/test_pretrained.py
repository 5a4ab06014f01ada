"""GGUF models through rl/pretrained.py: the one-time conversion to an HF folder gives the
same token ids and the same greedy answer as transformers' own GGUF load; bad files get
clear errors. A tiny Llama GGUF written here (gguf's GGUFWriter, random weights, a byte-level
vocabulary with a chat template) runs everywhere; the real SmolLM2-135M-Instruct file runs
only where `make smollm2` fetched it."""

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFWriter, TokenType
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

from rlpipe.core.errors import ModelNotFoundError
from rlpipe.engines.sampling import encode_prompt
from rlpipe.rl.pretrained import converted_folder, load_gguf_model

SMOLLM2_GGUF = Path(__file__).resolve().parents[2] / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _byte_symbols() -> list[str]:
    """GPT-2's byte-level alphabet: one printable symbol per byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    return [chr(byte) for byte in printable] + [chr(256 + index) for index in range(len(others))]


def write_tiny_llama_gguf(path: Path, architecture: str = "llama", hidden: int = 32, layers: int = 2) -> Path:
    """A float32 Llama GGUF: 2 layers, 4 heads (2 key/value), a byte-level BPE with 3 merges."""
    heads, kv_heads, ffn = 4, 2, 64
    head_dim = hidden // heads
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_byte_symbols(), "12", "Ġt", "he"]
    writer = GGUFWriter(str(path), architecture)
    writer.add_block_count(layers)
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_rope_dimension_count(head_dim)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL] * 3 + [TokenType.NORMAL] * (len(tokens) - 3))
    writer.add_token_merges(["1 2", "Ġ t", "h e"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> np.ndarray:  # shaped as torch's (out, in): GGUFWriter reverses it
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(len(tokens), hidden))
    for layer in range(layers):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"{block}.attn_q.weight", weight(hidden, hidden))
        writer.add_tensor(f"{block}.attn_k.weight", weight(kv_heads * head_dim, hidden))
        writer.add_tensor(f"{block}.attn_v.weight", weight(kv_heads * head_dim, hidden))
        writer.add_tensor(f"{block}.attn_output.weight", weight(hidden, hidden))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", weight(ffn, hidden))
        writer.add_tensor(f"{block}.ffn_up.weight", weight(ffn, hidden))
        writer.add_tensor(f"{block}.ffn_down.weight", weight(hidden, ffn))
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _direct_gguf_load(gguf_file: Path):
    """transformers' own GGUF load, as a user would do it without rlpipe."""
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32,
        quantization_config=GgufConfig(gguf_file=str(gguf_file), dequantize=True),
    )
    return model, tokenizer


def _greedy(model, prompt_ids: tuple[int, ...], new_tokens: int) -> list[int]:
    output = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                            max_new_tokens=new_tokens, do_sample=False, pad_token_id=2)
    return output[0, len(prompt_ids):].tolist()


def _assert_same_model(gguf_file: Path, question: str, new_tokens: int) -> tuple[list[int], str]:
    converted, converted_tokenizer = load_gguf_model(gguf_file)
    direct, direct_tokenizer = _direct_gguf_load(gguf_file)
    prompt_ids = encode_prompt(converted_tokenizer, question, "chat")
    assert prompt_ids == encode_prompt(direct_tokenizer, question, "chat")
    assert converted_tokenizer.eos_token_id == direct_tokenizer.eos_token_id
    assert torch.equal(converted.model.embed_tokens.weight, direct.model.embed_tokens.weight)
    with torch.no_grad():
        ids = torch.tensor([prompt_ids])
        torch.testing.assert_close(converted(ids).logits, direct(ids).logits)
    answer = _greedy(converted, prompt_ids, new_tokens)
    assert answer == _greedy(direct, prompt_ids, new_tokens)
    return answer, converted_tokenizer.decode(answer)


def test_tiny_gguf_converts_once_to_a_folder_with_the_same_greedy_answer(tmp_path):
    gguf_file = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    _assert_same_model(gguf_file, "the 12", new_tokens=6)
    folder = converted_folder(gguf_file)
    assert folder.parent == tmp_path and folder.name.startswith("tiny.hf-")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left
    weights = folder / "model.safetensors"
    written_ns = weights.stat().st_mtime_ns
    load_gguf_model(gguf_file)  # second load: from the folder, no new conversion
    assert weights.stat().st_mtime_ns == written_ns
    # The folder loads through the standard path, with the chat template kept.
    assert AutoTokenizer.from_pretrained(folder).chat_template is not None
    assert type(AutoModelForCausalLM.from_pretrained(folder)).__name__ == "LlamaForCausalLM"


def test_a_changed_file_gets_its_own_folder(tmp_path):
    first = converted_folder(write_tiny_llama_gguf(tmp_path / "model.gguf"))
    second = converted_folder(write_tiny_llama_gguf(tmp_path / "model.gguf", layers=1))
    assert first != second  # the key is the file's content hash


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="GGUF file not found") as info:
        load_gguf_model(tmp_path / "absent.gguf")
    assert "make smollm2" in info.value.hint


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip file, not a model")
    with pytest.raises(ModelNotFoundError, match="is not a GGUF file"):
        load_gguf_model(not_gguf)


def test_an_architecture_transformers_cannot_load_is_refused(tmp_path):
    writer = GGUFWriter(str(tmp_path / "odd.gguf"), "no-such-architecture")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(ModelNotFoundError, match="'no-such-architecture' model") as info:
        load_gguf_model(tmp_path / "odd.gguf")
    assert "llama" in info.value.hint  # the supported architectures are listed
    assert list(tmp_path.iterdir()) == [tmp_path / "odd.gguf"]  # nothing converted


@pytest.mark.skipif(not SMOLLM2_GGUF.is_file(), reason=f"SmolLM2 GGUF not fetched ({SMOLLM2_GGUF}); run `make smollm2`")
def test_smollm2_converted_folder_matches_the_gguf_load():
    answer_ids, answer = _assert_same_model(SMOLLM2_GGUF, "What is 17 + 25? Answer with only the number.", new_tokens=8)
    assert answer_ids and answer.strip()  # the instruct model answers something (its arithmetic is not tested here)
