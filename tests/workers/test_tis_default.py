"""Truncated importance sampling's default (workers/builders.py `tis_cap`): on wherever the
rows were not sampled by the weights an update starts from (another engine's numerics, or an
async run's older policy), off only for a synchronous hf run; a cap set in the config wins."""

from __future__ import annotations

import pytest
import torch

from rlpipe.core.config import load_config
from rlpipe.rl.policy import build_char_tokenizer, build_tiny_model
from rlpipe.workers.builders import DEFAULT_TIS_CAP, build_trainer, tis_cap


@pytest.mark.parametrize(("overrides", "expected"), [
    ([], None),  # synchronous hf: the engine's logprobs are the trainer's own
    (["rollout.max_staleness=1"], DEFAULT_TIS_CAP),  # rows one version old
    (["rollout.max_staleness=3"], DEFAULT_TIS_CAP),
    (['rollout.engine="vllm"'], DEFAULT_TIS_CAP),
    (["rollout.max_staleness=2", "algo.tis_cap=5.0"], 5.0),  # the user's cap is used as is
    (["algo.tis_cap=1.5"], 1.5),
])
def test_tis_is_on_by_default_when_rows_are_off_policy(overrides: list[str], expected: float | None) -> None:
    assert tis_cap(load_config(None, overrides)) == expected


def test_an_async_hf_trainer_is_built_with_tis() -> None:
    torch.set_num_threads(1)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model("qwen2", len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                             max_position_embeddings=32, seed=0)
    assert build_trainer(load_config(None, ["rollout.max_staleness=1"]), model).tis_cap == DEFAULT_TIS_CAP
    assert build_trainer(load_config(None, []), model).tis_cap is None
