"""HFEngine's common prefix (`common_prefix_sharing`): the tokens every prompt of a batch starts
with are prefilled once, as one row, and only each prompt's own suffix after them; that must
change the work done, never the samples, greedy or sampled, whatever the batch size, and every
stored logprob stays the one a full forward pass of prompt + completion recomputes."""

import pytest

from rlpipe.engines.hf import MIN_COMMON_PREFIX_TOKENS, HFEngine, common_prefix_length
from rlpipe.engines.sampling import SamplingParams
from tests.engines.test_hf_engine import count_forward_rows, full_forward_logprobs

PREFIX = "please reverse "  # 15 tokens of the character tokenizer, above MIN_COMMON_PREFIX_TOKENS
# suffixes of 2 to 7 tokens: the suffix prefill left-pads between the prefix and the suffix;
# "abc=" twice: a repeated prompt is still prefilled once
PROMPTS = [("a", PREFIX + "abc="), ("b", PREFIX + "hello="), ("c", PREFIX + "z="), ("d", PREFIX + "abc="), ("e", PREFIX + "qrstuv=")]


def samples(completions):
    return [(c.task_id, c.sample_idx, c.text, c.token_ids, c.finish_reason) for c in completions]


def test_the_common_prefix_runs_once_then_each_prompts_suffix(tiny_model, tokenizer):
    assert len(PREFIX) >= MIN_COMMON_PREFIX_TOKENS
    shapes = count_forward_rows(tiny_model)
    HFEngine(tiny_model, tokenizer, batch_size=64).generate(PROMPTS, SamplingParams(n=4, max_new_tokens=1))
    # max_new_tokens=1: only the prefill; 4 distinct prompts, the longest suffix "qrstuv=" is 7 tokens
    assert shapes == [(1, len(PREFIX)), (4, 7)]
    shapes.clear()
    HFEngine(tiny_model, tokenizer, batch_size=64, common_prefix_sharing=False).generate(PROMPTS, SamplingParams(n=4, max_new_tokens=1))
    assert shapes == [(4, len(PREFIX) + 7)]
    shapes.clear()
    short = [(task_id, prompt[len(PREFIX) - 3:]) for task_id, prompt in PROMPTS]  # "se " in common: too short to split
    HFEngine(tiny_model, tokenizer, batch_size=64).generate(short, SamplingParams(n=4, max_new_tokens=1))
    assert shapes == [(4, 10)]


@pytest.mark.parametrize("params", [
    SamplingParams(n=1, greedy=True, max_new_tokens=10, stop=("9",)),  # the held-out evaluation's kind of request
    SamplingParams(n=3, temperature=0.8, max_new_tokens=8, stop=("9", "ab"), seed=11),
])
@pytest.mark.parametrize("batch_size", [64, 4])  # 4: prompts straddle batches, each batch has its own prefix pass
def test_the_common_prefix_changes_no_sample(tiny_model, tokenizer, params, batch_size):
    shared = HFEngine(tiny_model, tokenizer, batch_size=batch_size).generate(PROMPTS, params)
    unshared = HFEngine(tiny_model, tokenizer, batch_size=batch_size, common_prefix_sharing=False).generate(PROMPTS, params)
    assert samples(shared) == samples(unshared)
    assert len({c.text for c in shared}) > 2  # the suffixes lead to different completions
    for mine, theirs in zip(shared, unshared):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)
    temperature = 1.0 if params.greedy else params.temperature
    for completion in shared:
        assert completion.logprobs == pytest.approx(full_forward_logprobs(tiny_model, completion, temperature), abs=1e-5)


def test_common_prefix_length_leaves_every_prompt_a_token_of_its_own():
    assert common_prefix_length([(1, 2, 3, 4), (1, 2, 3, 5, 6), (1, 2, 9)]) == 2
    assert common_prefix_length([(1, 2, 3), (1, 2, 3)]) == 2  # identical prompts: the last token is each one's own
    assert common_prefix_length([(1, 2), (1, 2, 3, 4)]) == 1  # one prompt starts the other
    assert common_prefix_length([(7, 2), (1, 2)]) == 0
