"""Fixtures of the engine tests: the character tokenizer and an opinionated tiny model
(tests/engines/test_hf_engine.py `opinionated_model`: its next token depends on the context)."""

import pytest
import torch

from rlpipe.rl.policy import build_char_tokenizer
from tests.engines.test_hf_engine import opinionated_model


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture()
def tiny_model(tokenizer):
    torch.set_num_threads(2)
    return opinionated_model(len(tokenizer), seed=0)
