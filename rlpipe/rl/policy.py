"""The policy: a character-level tokenizer, a tiny decoder-only model, and a local loader.

What it does:
- `build_char_tokenizer` makes a `PreTrainedTokenizerFast` with one token per character of an
  alphabet (built with the `tokenizers` library, no download), plus the special tokens
  <pad> <eos> <bos> <unk>. It is a byte-level BPE without merges, built exactly as
  transformers 5 rebuilds a Qwen2Tokenizer from a tokenizer.json, so a saved policy folder
  loads with the same ids through `AutoTokenizer.from_pretrained` whatever the architecture
  (see `build_char_tokenizer`).
- `build_tiny_model` makes a randomly initialised Qwen2 or Llama causal LM from a
  transformers config, seeded (initialised in float32, then cast to `dtype` and moved to
  `device`, so the same seed gives the same weights up to the cast on every device).
- `load_local_model` loads a model folder written by `save_pretrained` (config, weights,
  tokenizer) through the standard `AutoTokenizer` / `AutoModelForCausalLM` path, in `dtype`
  on `device`, and raises ModelNotFoundError with a hint when a piece is missing.
- `resolve_device` / `resolve_dtype` turn the config's strings ("auto", "cuda:1",
  "bfloat16") into torch objects; pure functions, no allocation on the device.

What it does not: download anything (no hub access), wrap LoRA adapters (rl/lora.py), or train.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

DeviceSpec = str
"""A device as the config writes it: "auto", "cpu", "cuda" or "cuda:N"."""

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from rlpipe.core.errors import ModelNotFoundError
from rlpipe.rl.model_folder import check_model_folder
from rlpipe.rl.char_tokenizer import BOS_TOKEN, DEFAULT_ALPHABET, EOS_TOKEN, PAD_TOKEN, UNK_TOKEN, char_tokenizer_backend




def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """A tokenizer with one id per character of `alphabet` (duplicates ignored).

    Ids 0..3 are <pad> <eos> <bos> <unk>; characters follow in alphabet order. Decoding
    concatenates characters with no spaces. A character outside the alphabet is dropped when
    encoding (no id; <unk> is kept as a special token but never produced).

    Why byte-level BPE: for a qwen2 config.json, transformers 5's AutoTokenizer always builds a
    `Qwen2Tokenizer` (qwen2 is in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, so no
    `tokenizer_class` in tokenizer_config.json changes that) and keeps only the vocabulary and
    merges of tokenizer.json: a byte-level BPE model without unknown token, NFC, a ByteLevel
    pre-tokenizer and decoder. A WordLevel vocabulary keyed by raw characters lost the space
    (and newline) that way. So the vocabulary is keyed by the byte-level symbol of each
    character (" " -> "Ġ", "\n" -> "Ċ"; printable ASCII maps to itself), with no merges, and the
    pipeline is the one that rebuild applies: both paths (the rebuild, and tokenizer.json read
    as saved for llama) give the same ids as this object. Ids are those of the previous
    character tokenizer for every character of the alphabet.
    """
    backend = char_tokenizer_backend(alphabet)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        unk_token=UNK_TOKEN,
        clean_up_tokenization_spaces=False,
        padding_side="left",  # saved in tokenizer_config.json: batched generation of a causal LM
    )
    return tokenizer


def resolve_device(spec: DeviceSpec, cuda_device_count: int | None = None) -> torch.device:
    """The torch device of `spec`: "auto" is cuda (device 0) when CUDA has a device, else cpu;
    "cuda" / "cuda:N" must name a device that exists. `cuda_device_count` None asks torch
    (tests pass a number). ValueError names the spec and what exists."""
    count = torch.cuda.device_count() if cuda_device_count is None else cuda_device_count
    text = spec.strip().lower()
    if text == "auto":
        return torch.device("cuda:0" if count > 0 else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "cuda" or text.startswith("cuda:"):
        index_text = text.partition(":")[2] or "0"
        if not index_text.isdigit():
            raise ValueError(f"device {spec!r} is not cpu, cuda or cuda:N; use e.g. 'cuda:0' or 'auto'")
        index = int(index_text)
        if index >= count:
            available = f"cuda:0..cuda:{count - 1}" if count else "no CUDA device"
            raise ValueError(f"device {spec!r} asked for, but this machine has {available}; "
                             "use model.device='auto' or 'cpu'")
        return torch.device("cuda", index)
    raise ValueError(f"unknown device {spec!r}; use auto, cpu, cuda or cuda:N")


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    """torch.float32 / torch.bfloat16 for "float32" / "bfloat16" (a torch.dtype passes through)."""
    if isinstance(name, torch.dtype):
        if name not in _DTYPES.values():
            raise ValueError(f"dtype {name} is not supported; use float32 or bfloat16")
        return name
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(_DTYPES)}") from None


def build_tiny_model(
    architecture: Literal["qwen2", "llama"],
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    seed: int,
    pad_token_id: int = 0,
    eos_token_id: int = 1,
    bos_token_id: int = 2,
    device: DeviceSpec | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
) -> PreTrainedModel:
    """A randomly initialised causal LM; the same seed gives the same weights (initialised in
    float32 on the CPU, then cast to `dtype` and moved to `device`)."""
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} must be divisible by num_heads {num_heads}")
    shared = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=bos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    if architecture == "qwen2":
        model: PreTrainedModel = Qwen2ForCausalLM(Qwen2Config(**shared))
    elif architecture == "llama":
        model = LlamaForCausalLM(LlamaConfig(**shared))
    else:
        raise ValueError(f"unknown architecture {architecture!r}; use 'qwen2' or 'llama'")
    return model.float().to(device=_as_device(device), dtype=resolve_dtype(dtype))


def load_local_model(
    path: str | Path, device: DeviceSpec | torch.device = "cpu", dtype: str | torch.dtype = "float32"
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Load (model, tokenizer) from a local folder written by `save_pretrained`, the weights
    in `dtype` on `device`."""
    folder = check_model_folder(path)
    target, torch_dtype = _as_device(device), resolve_dtype(dtype)
    hint = "pass a folder written by model.save_pretrained() and tokenizer.save_pretrained()"
    try:
        tokenizer = _load_tokenizer(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch_dtype)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelNotFoundError(f"cannot load the model in {folder}: {exc}", hint) from exc
    tokenizer.padding_side = "left"
    return model.to(target), tokenizer


def _as_device(device: DeviceSpec | torch.device) -> torch.device:
    return device if isinstance(device, torch.device) else resolve_device(device)


def load_local_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The tokenizer of a model folder, as `load_local_model` loads it (no weights are read)."""
    folder = check_model_folder(path)
    try:
        tokenizer = _load_tokenizer(folder)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelNotFoundError(f"cannot load the tokenizer in {folder}: {exc}",
                                 "pass a folder written by model.save_pretrained() and tokenizer.save_pretrained()") from exc
    tokenizer.padding_side = "left"
    return tokenizer


def _load_tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    """The standard path, as an HF user loads the folder: `AutoTokenizer.from_pretrained`."""
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)
