"""HFEngine's fast paths: prefix sharing, dropping finished rows, incremental stop strings, dtype/device.

The before/after switches (`prefix_sharing`, `drop_finished_rows`) must change the work done,
never the samples: each batch row draws its own uniform number per step, so the same seed
gives the same tokens on every path, and every stored logprob is the one a full forward pass
of prompt + completion recomputes (engines/base.py's convention)."""

import pytest
import torch

from rlpipe.engines.sampling import SamplingParams
from rlpipe.engines.hf import HFEngine, resolve_dtype
from rlpipe.engines.token_choice import choose_tokens
from rlpipe.rl.policy import build_tiny_model

# prompts of 1, 4, 12 and 3 tokens: every batch mixes prompt lengths (left padding)
PROMPTS = [("short", "7"), ("mid", "12+7"), ("long", "reverse abc="), ("mid2", "3=4")]
PATHS = [(True, True), (True, False), (False, True), (False, False)]  # (prefix_sharing, drop_finished_rows)


def opinionated_model(vocab_size, seed):
    """A tiny random model with larger weights than the initialiser's (std 0.02), so its next
    token depends on the context: greedy completions vary and a wrong cache shows."""
    model = build_tiny_model("qwen2", vocab_size, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=64, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))
    return model


def full_forward_logprobs(model, completion, temperature):
    """log_softmax(logits / T) of each completion token, from one unpadded forward pass of prompt + completion."""
    ids = torch.tensor([completion.prompt_token_ids + completion.token_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float() / temperature, dim=-1)
    start = len(completion.prompt_token_ids) - 1
    return [logprobs[start + i, token].item() for i, token in enumerate(completion.token_ids)]


def count_forward_rows(model):
    """Record the input_ids shape of every forward pass of `model` and of its deep copies (the
    engine deep-copies the model, hooks included)."""
    shapes = []
    model.register_forward_pre_hook(lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    return shapes


@pytest.mark.parametrize("batch_size", [32, 5])  # 5: a prompt's 3 samples straddle two batches
def test_every_path_gives_the_same_samples(tiny_model, tokenizer, batch_size):
    params = SamplingParams(n=3, temperature=0.8, max_new_tokens=8, stop=("9", "ab"), seed=11)
    results = [
        HFEngine(tiny_model, tokenizer, batch_size=batch_size, prefix_sharing=sharing, drop_finished_rows=drop).generate(PROMPTS, params)
        for sharing, drop in PATHS
    ]
    reference = results[0]
    assert any(c.finish_reason == "stop" for c in reference) and any(c.finish_reason == "length" for c in reference)
    for other in results[1:]:
        assert [(c.task_id, c.sample_idx, c.text, c.token_ids, c.finish_reason) for c in other] == [
            (c.task_id, c.sample_idx, c.text, c.token_ids, c.finish_reason) for c in reference
        ]
        for mine, theirs in zip(other, reference):
            assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)


def test_greedy_outputs_identical_with_and_without_prefix_sharing(tiny_model, tokenizer):
    params = SamplingParams(n=2, greedy=True, max_new_tokens=10)
    shared = HFEngine(tiny_model, tokenizer, prefix_sharing=True).generate(PROMPTS, params)
    unshared = HFEngine(tiny_model, tokenizer, prefix_sharing=False, drop_finished_rows=False).generate(PROMPTS, params)
    assert [(c.text, c.token_ids) for c in shared] == [(c.text, c.token_ids) for c in unshared]
    assert len({c.text for c in shared}) > 2  # the prompts lead to different completions
    for mine, theirs in zip(shared, unshared):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.4])
def test_shared_prefill_logprobs_equal_a_full_forward_pass(tiny_model, tokenizer, temperature):
    engine = HFEngine(tiny_model, tokenizer, batch_size=16)
    completions = engine.generate(PROMPTS, SamplingParams(n=4, temperature=temperature, max_new_tokens=8, seed=2))
    for completion in completions:
        assert completion.logprobs == pytest.approx(full_forward_logprobs(tiny_model, completion, temperature), abs=1e-5)


def test_prefix_sharing_prefills_each_prompt_once(tiny_model, tokenizer):
    shapes = count_forward_rows(tiny_model)
    HFEngine(tiny_model, tokenizer, batch_size=64).generate(PROMPTS, SamplingParams(n=8, max_new_tokens=1))
    # one batch of 4 prompts x 8 samples; max_new_tokens=1: only the prefill runs,
    # 4 distinct prompts, left-padded to the longest ("reverse abc=": 12 tokens)
    assert shapes == [(4, 12)]
    shapes.clear()
    HFEngine(tiny_model, tokenizer, batch_size=64, prefix_sharing=False).generate(PROMPTS, SamplingParams(n=8, max_new_tokens=1))
    assert shapes == [(32, 12)]  # 4 x 8 identical-per-prompt rows


def test_finished_rows_leave_the_batch(tiny_model, tokenizer):
    shapes = count_forward_rows(tiny_model)
    # stop on any digit or vowel: ~15 of the untrained model's ~68 tokens, so rows end at different steps
    params = SamplingParams(n=6, temperature=1.0, max_new_tokens=8, stop=tuple("0123456789aeiou"), seed=3)
    completions = HFEngine(tiny_model, tokenizer, batch_size=64).generate(PROMPTS, params)
    lengths = [len(c.token_ids) for c in completions]
    assert len(set(lengths)) > 2, "expected rows to end at different steps"
    # a row with L tokens is in the forward passes that produce tokens 2..L: L - 1 decode passes
    decode_rows = [rows for rows, width in shapes[1:]]
    assert all(width == 1 for _, width in shapes[1:])
    assert sum(decode_rows) == sum(length - 1 for length in lengths)
    assert decode_rows == sorted(decode_rows, reverse=True) and decode_rows[-1] < len(completions)
    shapes.clear()
    kept = HFEngine(tiny_model, tokenizer, batch_size=64, drop_finished_rows=False).generate(PROMPTS, params)
    assert [c.token_ids for c in kept] == [c.token_ids for c in completions]
    # without dropping, all 24 rows run until the longest ends
    assert [rows for rows, _ in shapes[1:]] == [len(completions)] * (max(lengths) - 1)


def test_multi_token_stop_string_cuts_where_it_completes(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer, batch_size=64)
    free = engine.generate(PROMPTS * 4, SamplingParams(n=4, max_new_tokens=16, seed=9))
    # a 3-character stop string (3 tokens of the character tokenizer) taken from the middle of some completion
    sample = next(c for c in free if c.finish_reason == "length" and len(c.text) >= 10 and "\n" not in c.text)
    stop = sample.text[4:7]
    stopped = engine.generate(PROMPTS * 4, SamplingParams(n=4, max_new_tokens=16, seed=9, stop=(stop,)))
    cut_rows = 0
    for before, after in zip(free, stopped):
        cut = before.text.find(stop)
        if cut < 0:  # (the free text excludes a final EOS)
            assert (after.text, after.token_ids, after.finish_reason) == (before.text, before.token_ids, before.finish_reason)
            continue
        # the completion ends at the first prefix of tokens whose text contains the stop string
        ends_at = next(k for k in range(1, len(before.token_ids) + 1) if stop in tokenizer.decode(before.token_ids[:k], skip_special_tokens=True))
        assert after.token_ids == before.token_ids[:ends_at] and after.finish_reason == "stop"
        assert after.text == before.text[:cut] and after.logprobs == pytest.approx(before.logprobs[:ends_at], abs=1e-6)
        cut_rows += 1
    assert cut_rows >= 1


def test_choose_tokens_inverse_cdf_by_hand():
    # softmax(logits / T) = [0.4, 0.3, 0.2, 0.1] at T = 0.5; cdf = [0.4, 0.7, 0.9, 1.0]:
    # u = 0.1 -> 0, 0.39 -> 0, 0.41 -> 1, 0.69 -> 1, 0.71 -> 2, 0.95 -> 3
    logits = (0.5 * torch.log(torch.tensor([4.0, 3.0, 2.0, 1.0]))).repeat(6, 1)
    uniforms = torch.tensor([0.1, 0.39, 0.41, 0.69, 0.71, 0.95])
    tokens, _ = choose_tokens(logits, SamplingParams(temperature=0.5), uniforms)
    assert tokens.tolist() == [0, 0, 1, 1, 2, 3]
    # top_p = 0.6 keeps [0.4, 0.3] (mass 0.7): targets u * 0.7 against cdf [0.4, 0.7, 0.7, 0.7]:
    # 0.1 -> 0.07 -> 0; 0.39 -> 0.273 -> 0; 0.41 -> 0.287 -> 0; 0.69 -> 0.483 -> 1; 0.71 -> 0.497 -> 1; 0.95 -> 0.665 -> 1
    tokens, _ = choose_tokens(logits, SamplingParams(temperature=0.5, top_p=0.6), uniforms)
    assert tokens.tolist() == [0, 0, 0, 1, 1, 1]
    # the largest float32 below 1 never reaches a zero-weight token
    tokens, _ = choose_tokens(logits[:1], SamplingParams(temperature=0.5, top_p=0.6), torch.tensor([1 - 2**-24]))
    assert tokens.tolist() == [1]


def test_bfloat16_engine_samples_in_bfloat16_and_takes_float32_weights(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer, dtype="bfloat16")
    params = SamplingParams(n=2, greedy=True, max_new_tokens=6)
    completions = engine.generate(PROMPTS, params)
    bf16_model = opinionated_model(len(tokenizer), seed=0).to(torch.bfloat16)
    for completion in completions:
        # the cached decode and a full bf16 forward round differently: bf16 has ~3 significant digits
        assert completion.logprobs == pytest.approx(full_forward_logprobs(bf16_model, completion, 1.0), abs=0.1)
    other = opinionated_model(len(tokenizer), seed=1)  # float32 weights
    engine.load_weights(other.named_parameters(), policy_version=1)
    assert [c.logprobs for c in engine.generate(PROMPTS, params)] != [c.logprobs for c in completions]
    assert HFEngine(tiny_model, tokenizer, dtype=torch.bfloat16).generate(PROMPTS, params) == completions


def test_bad_dtype_and_device_are_clear_errors(tiny_model, tokenizer):
    assert resolve_dtype("float32") is torch.float32 and resolve_dtype(torch.bfloat16) is torch.bfloat16
    with pytest.raises(ValueError, match="float32"):
        HFEngine(tiny_model, tokenizer, dtype="float16")
    with pytest.raises(ValueError, match="cuda:N"):
        HFEngine(tiny_model, tokenizer, device="gpu0")
    with pytest.raises(ValueError, match="no tokens"):
        HFEngine(tiny_model, tokenizer).generate([("empty", "")], SamplingParams())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_engine_logprobs_match_a_full_forward_pass(tiny_model, tokenizer, dtype):
    engine = HFEngine(tiny_model, tokenizer, device="cuda", dtype=dtype)
    completions = engine.generate(PROMPTS, SamplingParams(n=4, temperature=0.7, max_new_tokens=8, seed=1))
    reference = opinionated_model(len(tokenizer), seed=0).to(dtype)
    tolerance = 1e-4 if dtype == torch.float32 else 0.1  # TF32/bf16 rounding on the GPU
    for completion in completions:
        assert completion.logprobs == pytest.approx(full_forward_logprobs(reference, completion, 0.7), abs=tolerance)
