"""rollout.engine_dtype (workers/engine_worker.py build_engine, workers/builders.py): the
engine alone runs in that dtype while the trainer keeps model.dtype; a weight sync from the
float32 trainer lands rounded to the engine's dtype; truncated importance sampling is then on
by default, because the engine's logprobs are no longer the trainer's own."""

from __future__ import annotations

from pathlib import Path

import torch

from rlpipe.core.config import load_config
from rlpipe.engines.sampling import SamplingParams
from rlpipe.workers import weights
from rlpipe.workers.builders import DEFAULT_TIS_CAP, build_policy, tis_cap
from rlpipe.workers.engine_worker import build_engine

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64"]


def test_the_engine_runs_in_its_own_dtype_and_takes_the_trainers_float32_weights_rounded(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    config = load_config(None, [*TINY, 'rollout.engine_dtype="bfloat16"', "model.device=\"cpu\""])
    engine = build_engine(config, str(tmp_path))
    trainer_policy, _ = build_policy(config)
    assert {p.dtype for p in trainer_policy.parameters()} == {torch.float32}
    assert {p.dtype for _, p in engine.named_weights()} == {torch.bfloat16}
    with torch.no_grad():  # weights the engine does not have yet, as after an update
        for parameter in trainer_policy.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.01)
    named = list(trainer_policy.named_parameters())
    for index, chunk in enumerate(weights.plan_chunks(named, chunk_bytes=4096)):
        path = tmp_path / f"chunk-{index}.safetensors"
        weights.write_chunk(named, chunk, path, policy_version=1)
        weights.load_chunk(path, engine.rows_view)
    engine_weights = dict(engine.named_weights())
    for name, parameter in named:
        assert torch.equal(engine_weights[name], parameter.detach().to(torch.bfloat16)), name
    completions = engine.generate([("t", "5+5=")], SamplingParams(n=2, max_new_tokens=3, seed=0))
    assert all(c.logprobs and all(lp <= 0.0 for lp in c.logprobs) for c in completions)


def test_tis_is_on_by_default_when_the_engine_dtype_differs_from_the_trainers() -> None:
    assert tis_cap(load_config(None, ['rollout.engine_dtype="bfloat16"'])) == DEFAULT_TIS_CAP
    assert tis_cap(load_config(None, ['rollout.engine_dtype="float32"'])) is None  # the model's own dtype
    assert tis_cap(load_config(None, ['model.dtype="bfloat16"', 'rollout.engine_dtype="bfloat16"'])) is None
    assert tis_cap(load_config(None, ['rollout.engine_dtype="bfloat16"', "algo.tis_cap=1.5"])) == 1.5
