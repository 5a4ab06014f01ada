"""eval.engine_dtype / eval.batch_size (engines/hf.py `with_settings`, workers/engine_worker.py,
controller/evaluation.py `evaluation_options`): a greedy evaluation runs in its own dtype on a
cast copy of the engine's weights, at its own batch size, and the copy is gone after the
request; the engine's rollout weights stay the trainer's, in the trainer's dtype."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch

from rlpipe.controller.evaluation import evaluation_options
from rlpipe.controller.preflight import check_engine_options
from rlpipe.core.config import load_config
from rlpipe.core.errors import ConfigError
from rlpipe.engines.hf import HFEngine
from rlpipe.engines.sampling import SamplingParams
from rlpipe.workers import weights
from rlpipe.workers.builders import build_policy, build_tokenizer
from rlpipe.workers.engine_worker import EngineService
from rlpipe.workers.protocol import Generate
from tests.engines.test_hf_engine import count_forward_rows, opinionated_model

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64", 'model.device="cpu"']
PROMPTS = [(f"t{i}", f"{i}+{i + 3}=") for i in range(5)]
GREEDY = SamplingParams(n=1, max_new_tokens=6, seed=0, greedy=True)
SAMPLED = SamplingParams(n=2, temperature=0.9, max_new_tokens=6, seed=3)


def _rows(completions):
    return [(c.task_id, c.sample_idx, c.token_ids, c.logprobs, c.text) for c in completions]


def test_a_cast_copy_evaluates_as_an_engine_built_in_that_dtype_and_batch_would() -> None:
    torch.set_num_threads(1)
    config = load_config(None, TINY)
    tokenizer = build_tokenizer(config)
    model = opinionated_model(len(tokenizer), seed=0)
    shapes = count_forward_rows(model)
    engine = HFEngine(model, tokenizer, batch_size=2)
    rollouts_before = engine.generate(PROMPTS, SAMPLED)

    shapes.clear()
    evaluator = engine.with_settings("bfloat16", 5)
    evaluated = evaluator.generate(PROMPTS, GREEDY)
    assert {p.dtype for _, p in evaluator.named_weights()} == {torch.bfloat16}
    assert max(rows for rows, _ in shapes) == 5  # the five prompts in one batch
    built_in_bf16 = HFEngine(model, tokenizer, batch_size=5, dtype="bfloat16").generate(PROMPTS, GREEDY)
    assert _rows(evaluated) == _rows(built_in_bf16)  # logprobs too: the same bf16 weights and buffers
    assert _rows(evaluated) != _rows(engine.with_settings(batch_size=5).generate(PROMPTS, GREEDY))  # not float32's

    cast_weights = dict(evaluator.named_weights())  # tied embeddings stay one tensor (listed once) in the copy
    assert set(cast_weights) == {name for name, _ in model.named_parameters()} and "lm_head.weight" not in cast_weights
    copy_ref = weakref.ref(cast_weights["model.embed_tokens.weight"])
    del evaluator, cast_weights
    gc.collect()
    assert copy_ref() is None

    own = dict(engine.named_weights())  # the engine's own weights: untouched, float32, still the model's
    assert all(own[name].dtype == torch.float32 and torch.equal(own[name], p) for name, p in model.named_parameters())
    shapes.clear()
    assert _rows(engine.generate(PROMPTS, SAMPLED)) == _rows(rollouts_before)
    assert max(rows for rows, _ in shapes) == 2  # rollouts keep the engine's own batch size


def test_the_engine_worker_evaluates_in_the_asked_dtype_and_frees_the_copy(tmp_path: Path, monkeypatch) -> None:
    torch.set_num_threads(1)
    config = load_config(None, [*TINY, 'eval.engine_dtype="bfloat16"', "eval.batch_size=5", "rollout.batch_size=2"])
    service = EngineService("r", config, str(tmp_path))
    trainer_policy, _ = build_policy(config)
    trainers = weights.digest(trainer_policy.named_parameters())
    assert weights.digest(service.engine.named_weights()) == trainers
    copies: list[weakref.ref] = []
    dtypes: list[set] = []
    with_settings = HFEngine.with_settings

    def recording(engine, dtype=None, batch_size=None):
        other = with_settings(engine, dtype, batch_size)
        weight = next(iter(other.named_weights()))[1]
        copies.append(weakref.ref(weight))
        dtypes.append({p.dtype for _, p in other.named_weights()})
        return other

    monkeypatch.setattr(HFEngine, "with_settings", recording)
    options = evaluation_options(config)
    assert options == {"dtype": "bfloat16", "batch_size": 5}
    result = service.handle(Generate(tuple(PROMPTS), GREEDY, **options))
    gc.collect()
    assert dtypes == [{torch.bfloat16}] and copies[0]() is None  # evaluated in bf16; the copy is gone
    assert weights.digest(service.engine.named_weights()) == trainers  # the rollout weights are still the trainer's
    assert {p.dtype for _, p in service.engine.named_weights()} == {torch.float32}
    assert result.policy_version == service.engine.policy_version
    reference = HFEngine(trainer_policy, build_tokenizer(config), batch_size=5, dtype="bfloat16").generate(PROMPTS, GREEDY)
    assert _rows(result.completions) == _rows(reference)
    assert evaluation_options(load_config(None, TINY)) == {}  # unset: the engine's own dtype and batching


def test_other_engines_refuse_an_evaluation_dtype_or_batch_size() -> None:
    for key in ('eval.engine_dtype="bfloat16"', "eval.batch_size=200"):
        with pytest.raises(ConfigError, match="only the hf engine"):
            check_engine_options(load_config(None, ['rollout.engine="openai"', 'rollout.openai_base_url="http://127.0.0.1:1/v1"', key]))
    check_engine_options(load_config(None, ['eval.engine_dtype="bfloat16"', "eval.batch_size=200"]))  # hf: accepted
