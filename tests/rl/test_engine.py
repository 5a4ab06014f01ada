"""HFEngine: n samples, stop strings, EOS, logprobs, determinism, weight sync."""

import math

import pytest
import torch

from rlpipe.engines.sampling import SamplingParams
from rlpipe.engines.hf import HFEngine
from rlpipe.engines.token_choice import choose_tokens
from rlpipe.rl.policy import build_tiny_model

PROMPTS = [("a", "12+7="), ("b", "reverse abc="), ("c", "3=")]


def recomputed_logprobs(model, completion, temperature=1.0, top_p=1.0):
    """log p of each completion token under softmax(logits / T) of a fresh full forward pass,
    renormalised over the nucleus (most likely tokens until their mass reaches top_p)."""
    ids = torch.tensor([completion.prompt_token_ids + completion.token_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].double() / temperature, dim=-1)
    start = len(completion.prompt_token_ids) - 1
    result = []
    for i, token in enumerate(completion.token_ids):
        row = logprobs[start + i]
        probs = sorted(row.exp().tolist(), reverse=True)
        kept, mass = 0.0, 0.0
        for p in probs:
            if mass >= top_p:
                break
            kept, mass = kept + p, mass + p
        result.append(row[token].item() - math.log(kept))
    return result


def test_n_samples_per_prompt_in_order(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer, batch_size=4)  # 9 rows -> batches of 4, 4, 1
    completions = engine.generate(PROMPTS, SamplingParams(n=3, max_new_tokens=5, seed=1))
    assert [(c.task_id, c.sample_idx) for c in completions] == [(t, i) for t, _ in PROMPTS for i in range(3)]
    for completion in completions:
        assert 1 <= len(completion.token_ids) <= 5 and len(completion.logprobs) == len(completion.token_ids)
        assert completion.finish_reason in ("stop", "length") and completion.policy_version == 0
        assert completion.prompt_token_ids == tuple(tokenizer(dict(PROMPTS)[completion.task_id])["input_ids"])


@pytest.mark.parametrize("temperature", [0.5, 0.7, 1.3])
def test_sampled_logprobs_are_those_of_the_tempered_distribution(tiny_model, tokenizer, temperature):
    engine = HFEngine(tiny_model, tokenizer, batch_size=8)
    for completion in engine.generate(PROMPTS, SamplingParams(n=3, temperature=temperature, max_new_tokens=6, seed=3)):
        assert completion.logprobs == pytest.approx(recomputed_logprobs(tiny_model, completion, temperature), abs=1e-4)
        # and not those of the temperature-1 policy (the schema-1 convention)
        assert completion.logprobs != pytest.approx(recomputed_logprobs(tiny_model, completion, 1.0), abs=1e-3)


def test_top_p_logprobs_are_renormalised_over_the_nucleus(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer, batch_size=8)
    for completion in engine.generate(PROMPTS, SamplingParams(n=3, temperature=0.7, top_p=0.5, max_new_tokens=6, seed=4)):
        assert completion.logprobs == pytest.approx(recomputed_logprobs(tiny_model, completion, 0.7, top_p=0.5), abs=1e-4)


def test_greedy_stores_temperature_one_logprobs_of_the_argmax(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer, batch_size=8)
    for completion in engine.generate(PROMPTS, SamplingParams(greedy=True, temperature=0.5, max_new_tokens=6)):
        assert completion.logprobs == pytest.approx(recomputed_logprobs(tiny_model, completion, 1.0), abs=1e-4)


def test_choose_tokens_by_hand_with_temperature_and_top_p():
    # logits = T * ln([4, 3, 2, 1]) at T = 0.5, so softmax(logits / T) = [0.4, 0.3, 0.2, 0.1].
    # top_p = 0.6: mass before each sorted token = [0, 0.4, 0.7, 0.9]; kept while < 0.6 -> tokens 0, 1,
    # nucleus mass 0.7, renormalised [4/7, 3/7]: logprobs ln(4/7) = -0.5596158, ln(3/7) = -0.8472979.
    logits = (0.5 * torch.log(torch.tensor([4.0, 3.0, 2.0, 1.0]))).repeat(400, 1)
    params = SamplingParams(temperature=0.5, top_p=0.6)
    tokens, logprobs = choose_tokens(logits, params, torch.rand(400, generator=torch.Generator().manual_seed(0)))
    assert set(tokens.tolist()) == {0, 1}
    expected = {0: math.log(4 / 7), 1: math.log(3 / 7)}
    assert logprobs.tolist() == pytest.approx([expected[t] for t in tokens.tolist()], abs=1e-6)
    # top_p = 1: the full tempered distribution, token 3 has ln 0.1 = -2.3025851 when drawn
    tokens, logprobs = choose_tokens(logits, SamplingParams(temperature=0.5), torch.rand(400, generator=torch.Generator().manual_seed(0)))
    assert 3 in tokens.tolist()
    assert logprobs.tolist() == pytest.approx([math.log([0.4, 0.3, 0.2, 0.1][t]) for t in tokens.tolist()], abs=1e-6)


def test_deterministic_by_seed(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    first = engine.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=6, seed=5))
    assert first == engine.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=6, seed=5))
    assert first != engine.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=6, seed=6))


def test_stop_string_cuts_text_and_keeps_the_stop_token(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    params = SamplingParams(n=4, max_new_tokens=12, seed=7)
    free = engine.generate(PROMPTS, params)
    # pick a character the untrained model wrote in the middle of some completion as the stop string
    sample = next(c for c in free if c.finish_reason == "length" and len(c.text) >= 4 and len(set(c.text)) > 1)
    stop_char = sample.text[2]
    stopped = engine.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=12, seed=7, stop=(stop_char, "zzzz")))
    for before, after in zip(free, stopped):
        cut = before.text.find(stop_char)
        if cut < 0 or before.finish_reason == "stop" and len(before.text) <= cut:
            assert after.text == before.text
            continue
        assert after.finish_reason == "stop" and after.text == before.text[:cut]
        assert tokenizer.decode(after.token_ids[-1:]) == stop_char  # the stop token is kept for training
        assert after.token_ids == before.token_ids[: len(after.token_ids)]
        # the same tokens; their logprobs equal up to float rounding: once a sequence stops the
        # batch shrinks, and CPU kernels may sum in another order for another shape (seen: 5e-7)
        assert after.logprobs == pytest.approx(before.logprobs[: len(after.token_ids)], abs=1e-4)


def test_eos_stops_and_is_kept_but_not_in_text(tiny_model, tokenizer):
    # an untrained model puts ~1/65 of its mass on EOS: 480 samples x 3 tokens give ~20 EOS endings
    engine = HFEngine(tiny_model, tokenizer)
    completions = engine.generate(PROMPTS * 20, SamplingParams(n=8, max_new_tokens=3, seed=0))
    ended = [c for c in completions if c.token_ids[-1] == tokenizer.eos_token_id]
    assert ended, "expected some samples to end with EOS"
    for completion in ended:
        assert completion.finish_reason == "stop"
        assert completion.text == tokenizer.decode(completion.token_ids[:-1], skip_special_tokens=True)
        assert tokenizer.eos_token_id not in completion.token_ids[:-1]


def test_engine_has_its_own_copy_and_load_weights_changes_outputs(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    params = SamplingParams(greedy=True, max_new_tokens=6)
    before = engine.generate(PROMPTS, params)
    with torch.no_grad():
        for parameter in tiny_model.parameters():
            parameter.add_(torch.randn_like(parameter))
    assert engine.generate(PROMPTS, params) == before  # trainer-side edits do not leak
    other = build_tiny_model("qwen2", len(tokenizer), 32, 1, 2, 64, 64, seed=1)
    engine.load_weights(other.named_parameters(), policy_version=3)
    after = engine.generate(PROMPTS, params)
    assert engine.policy_version == 3 and all(c.policy_version == 3 for c in after)
    assert [c.logprobs for c in after] != [c.logprobs for c in before]
    for completion in after:
        assert completion.logprobs == pytest.approx(recomputed_logprobs(other, completion), abs=1e-4)
    with pytest.raises(ValueError, match="no parameter"):
        engine.load_weights([("not.a.weight", torch.zeros(1))], policy_version=4)


def test_sampling_params_validation():
    with pytest.raises(ValueError):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError):
        SamplingParams(stop=("",))
