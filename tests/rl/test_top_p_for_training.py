"""rollout.top_p < 1 is refused for training: the trainer's logprobs are those of the whole
tempered distribution, the engine's those of the renormalised nucleus (engines/base.py), so
the first step's ratio starts at the nucleus mass, below the clip range. Evaluation keeps
its own top_p."""

from __future__ import annotations

import pytest
import torch

from rlpipe.agents.policy import PolicyOptions
from rlpipe.controller.eval_policy import policy_run_config, sampling_params
from rlpipe.controller.launch import build_runtime
from rlpipe.controller.preflight import preflight
from rlpipe.core.config import load_config
from rlpipe.core.errors import ConfigError
from rlpipe.engines.hf import HFEngine
from rlpipe.engines.sampling import SamplingParams
from rlpipe.rl.batching import TrainSample, pad_samples, token_logprobs
from rlpipe.rl.losses import policy_loss

PROMPTS = [("a", "12+7="), ("b", "reverse abc="), ("c", "3=")]
CLIP_EPS = 0.2


def _first_ratios(model, tokenizer, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """exp(trainer - engine) on every completion token of fresh rollouts, before any update;
    and the mask of completion tokens."""
    completions = HFEngine(model, tokenizer, batch_size=8).generate(
        PROMPTS, SamplingParams(n=4, temperature=1.0, top_p=top_p, max_new_tokens=6, seed=5))
    samples = [TrainSample(c.prompt_token_ids, c.token_ids, c.logprobs, advantage=-1.0) for c in completions]
    batch = pad_samples(samples)
    with torch.no_grad():
        new = token_logprobs(model, batch, temperature=1.0)
    return torch.exp(new - batch.old_logprobs), batch.completion_mask


def test_the_first_ratio_starts_below_the_clip_range_with_top_p_below_1(tiny_model, tokenizer):
    ratio, mask = _first_ratios(tiny_model, tokenizer, top_p=0.5)
    on_tokens = ratio[mask.bool()]
    assert bool((on_tokens <= 1 + 1e-4).all())  # the nucleus mass, at most 1
    assert float((on_tokens < 1 - CLIP_EPS).float().mean()) > 0.5  # most below the clip range: no gradient there
    full, full_mask = _first_ratios(tiny_model, tokenizer, top_p=1.0)
    assert full[full_mask.bool()] == pytest.approx(torch.ones(int(full_mask.sum())), abs=1e-4)
    # with negative advantages, the clipped branch binds on those tokens before any update
    _, metrics = policy_loss(torch.log(ratio), torch.zeros_like(ratio), torch.full((ratio.shape[0],), -1.0), mask, CLIP_EPS)
    assert metrics.clip_frac > 0.5


def test_a_training_run_with_top_p_below_1_is_refused_before_the_lake_is_made(tmp_path):
    lake = tmp_path / "lake"
    config = load_config(None, ["rollout.top_p=0.9", f'storage.lake_uri="{lake}"'])
    with pytest.raises(ConfigError, match=r"rollout\.top_p=0\.9") as raised:
        preflight(config)
    assert "rollout.top_p=1" in raised.value.hint and "\n" not in raised.value.message
    with pytest.raises(ConfigError, match=r"rollout\.top_p=0\.9"):
        build_runtime("top-p-run", config)  # a deployment's run, which skips the CLI's preflight
    assert not lake.exists()


def test_evaluation_still_samples_with_top_p_even_from_a_config_that_sets_it(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("[rollout]\ntop_p = 0.9\n")  # the refusal is the training run's, not the config loader's
    options = PolicyOptions(policy=str(tmp_path), config=str(config), temperature=0.7, top_p=0.9)
    assert sampling_params(options).top_p == 0.9
    assert policy_run_config(options).rollout.top_p == 0.9
