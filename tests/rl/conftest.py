import pytest
import torch

from rlpipe.rl.policy import build_char_tokenizer, build_tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture()
def tiny_model(tokenizer):
    torch.set_num_threads(2)
    return build_tiny_model("qwen2", len(tokenizer), hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=64, seed=0)
