"""The tiny model's character vocabulary, built with the `tokenizers` library alone.

What it does: `char_tokenizer_backend` makes the `tokenizers.Tokenizer` behind the policy's
character tokenizer (one id per character of an alphabet after the special tokens; see
rl/policy.py `build_char_tokenizer`, which wraps it for transformers), and
`policy_alphabet` says which alphabet a run's domains need. The controller's pre-flight
counts prompt tokens with the backend, so it never imports torch or transformers.

What it does not: wrap the backend for transformers, or build a model (rl/policy.py).
"""

from __future__ import annotations

import string
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
BOS_TOKEN = "<bos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN)

DEFAULT_ALPHABET = string.digits + "+-*=/ \n" + string.ascii_lowercase + ".,:;?!'\"()_#<>[]{}"
"""Digits, arithmetic operators, space and newline, lowercase letters, prompt punctuation."""


def policy_alphabet(domains: Iterable[str]) -> str:
    """The tiny model's characters: DEFAULT_ALPHABET, and with the code domain also the rest
    of printable ASCII (capitals for True/None, `%`, `@`, `|`, tab...), appended so that the
    ids of the default characters, and runs without code, do not change. Anything else
    (HumanEval's few non-ASCII prompt characters) encodes as <unk>."""
    if "code" not in set(domains):
        return DEFAULT_ALPHABET
    return DEFAULT_ALPHABET + "".join(sorted(set(string.printable) - set(DEFAULT_ALPHABET)))


def char_tokenizer_backend(alphabet: str = DEFAULT_ALPHABET) -> Tokenizer:
    """A byte-level BPE without merges: ids 0..3 are the special tokens, then one id per
    character of `alphabet` (duplicates ignored) keyed by its byte-level symbol (" " -> "Ġ").
    Why this shape: rl/policy.py `build_char_tokenizer`."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    for char in alphabet:
        symbols = "".join(piece for piece, _ in byte_level.pre_tokenize_str(char))
        if len(symbols) != 1:
            raise ValueError(f"alphabet character {char!r} is not one byte in UTF-8; use ASCII characters")
        vocab.setdefault(symbols, len(vocab))
    backend = Tokenizer(
        models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False,
                   continuing_subword_prefix="", end_of_word_suffix="")
    )
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = byte_level
    backend.decoder = decoders.ByteLevel()
    return backend
