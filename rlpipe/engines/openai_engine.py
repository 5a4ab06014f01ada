"""OpenAIEngine: rollouts from any OpenAI-compatible completions server (e.g. `vllm serve`).

What it does: encodes each prompt with `engines.base.encode_prompt` and sends the token ids
as the completion prompt (the server does not tokenize again, so the trainer scores exactly
the sampled ids), one request per prompt with `n` samples, `logprobs=0` (the sampled token's
logprob only), the call's stop strings and a per-prompt seed (as VLLMEngine derives it).
Token ids of the completion come from vLLM's `return_token_ids` extension, or else from
`return_tokens_as_token_ids` ("token_id:123" in the logprobs' tokens); a server that gives
neither is refused with EngineFailed, because decoding text back to ids is not exact.

Logprob convention: engines/base.py's (the distribution actually sampled) holds only when the
server returns processed logprobs: start vLLM with `--logprobs-mode processed_logprobs`
(vLLM's default, raw_logprobs, gives temperature-1 logprobs of the unprocessed logits).
This engine cannot see the server's flag: the tests in tests/vllm check it end to end.

Weights: a server started on a folder serves that folder's weights. `load_weights` refuses
with a ValueError that says what to do. vLLM's server does have an RL weight-transfer API
(`/init_weight_transfer_engine`, `/update_weights`, `/finish_weight_update` in
vllm/entrypoints/rl/online, with NCCL or CUDA-IPC backends): it moves tensors between GPU
processes and is not wired here. Use this engine for evaluating a frozen policy, and
rollout.engine = "vllm" (weights loaded in place) for training.

What it does not: chat completions (prompts are rendered by encode_prompt instead), streaming,
retries (an HTTP failure is EngineFailed; the task retries).
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from rlpipe.core.errors import EngineFailed
from rlpipe.core.records import Completion
from rlpipe.engines.sampling import PromptFormat, SamplingParams, encode_prompt
from rlpipe.engines.vllm import prompt_seed

TOKEN_ID_PREFIX = "token_id:"


class OpenAIEngine:
    """Completions with logprobs from an OpenAI-compatible server; the server owns the weights."""

    def __init__(
        self, base_url: str, *, model: str | None = None, tokenizer: Any, prompt_format: PromptFormat = "plain",
        max_concurrent_requests: int = 8, timeout_s: float = 600.0,
    ) -> None:
        import openai

        self._openai = openai
        self._client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=timeout_s, max_retries=0)
        self._base_url = base_url
        self._tokenizer = tokenizer
        self._prompt_format = prompt_format
        self._max_concurrent = max_concurrent_requests
        self._model = model or self._only_served_model()

    @property
    def policy_version(self) -> int:
        """Always 0: the server's weights never change under this engine."""
        return 0

    @property
    def tokenizer(self) -> object:
        """The tokenizer prompts are encoded with (a policy agent's chat is rendered with it)."""
        return self._tokenizer

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], policy_version: int) -> None:
        raise ValueError(
            f"rollout.engine = 'openai' cannot take new weights: the server at {self._base_url} serves the weights it "
            "was started with. Train with rollout.engine = 'vllm' (weights loaded in place) or 'hf'; use 'openai' to "
            "evaluate a frozen policy (restart the server on an exported checkpoint to evaluate another one)"
        )

    def generate(self, prompts: list[tuple[str, str]], params: SamplingParams) -> list[Completion]:
        """`params.n` completions per prompt, in prompt order then sample_idx order."""
        encoded = [encode_prompt(self._tokenizer, prompt, self._prompt_format) for _, prompt in prompts]
        for (task_id, _), ids in zip(prompts, encoded):
            if not ids:
                raise ValueError(f"prompt of task {task_id!r} encodes to no tokens; the server needs at least one")
        jobs = [(task_id, ids, prompt_seed(params.seed, index)) for index, ((task_id, _), ids) in enumerate(zip(prompts, encoded))]
        with ThreadPoolExecutor(max_workers=min(self._max_concurrent, max(1, len(jobs)))) as pool:
            per_prompt = list(pool.map(lambda job: self._complete(*job, params), jobs))
        return [completion for completions in per_prompt for completion in completions]

    def _complete(self, task_id: str, prompt_ids: tuple[int, ...], seed: int, params: SamplingParams) -> list[Completion]:
        try:
            response = self._client.completions.create(
                model=self._model,
                prompt=list(prompt_ids),
                n=params.n,
                temperature=0.0 if params.greedy else params.temperature,
                top_p=1.0 if params.greedy else params.top_p,
                max_tokens=params.max_new_tokens,
                stop=list(params.stop) or None,
                seed=seed,
                logprobs=0,
                extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True, "skip_special_tokens": True},
            )
        except self._openai.APIError as exc:
            raise EngineFailed(f"completions request to {self._base_url} failed: {exc}",
                               "check that the server is up and serves the model; the task retries") from exc
        choices = sorted(response.choices, key=lambda choice: choice.index)
        if len(choices) != params.n:
            raise EngineFailed(f"the server returned {len(choices)} choices for n={params.n}", "use a server that supports n > 1")
        return [self._completion(task_id, prompt_ids, choice) for choice in choices]

    def _completion(self, task_id: str, prompt_ids: tuple[int, ...], choice: Any) -> Completion:
        logprobs = choice.logprobs
        if logprobs is None or logprobs.token_logprobs is None:
            raise EngineFailed(f"the server at {self._base_url} returned no logprobs", "use a server that supports completions logprobs")
        token_ids = _token_ids(choice)
        values = tuple(float(value) for value in logprobs.token_logprobs)
        if len(values) != len(token_ids):
            raise EngineFailed(f"the server returned {len(values)} logprobs for {len(token_ids)} tokens", "a server bug; the task retries")
        if choice.finish_reason not in ("stop", "length"):
            raise EngineFailed(f"the server finished a sample with reason {choice.finish_reason!r}", "the task retries")
        return Completion(
            task_id=task_id, sample_idx=choice.index, text=choice.text, prompt_token_ids=prompt_ids, token_ids=token_ids,
            logprobs=values, finish_reason=choice.finish_reason, policy_version=0,
        )

    def _only_served_model(self) -> str:
        try:
            served = [entry.id for entry in self._client.models.list()]
        except self._openai.APIError as exc:
            raise EngineFailed(f"cannot list the models of {self._base_url}: {exc}", "is the server up?") from exc
        if len(served) != 1:
            raise ValueError(f"the server at {self._base_url} serves {served}; set rollout.openai_model to one of them")
        return served[0]


def _token_ids(choice: Any) -> tuple[int, ...]:
    """The completion's token ids: vLLM's `token_ids` field, else "token_id:N" logprob tokens."""
    direct = getattr(choice, "token_ids", None) or (choice.model_extra or {}).get("token_ids")
    if direct is not None:
        return tuple(int(token) for token in direct)
    tokens = choice.logprobs.tokens or []
    if tokens and all(token.startswith(TOKEN_ID_PREFIX) for token in tokens):
        return tuple(int(token[len(TOKEN_ID_PREFIX):]) for token in tokens)
    raise EngineFailed("the server returned no token ids (neither `return_token_ids` nor `return_tokens_as_token_ids`)",
                       "use vLLM's OpenAI server, or another one that returns completion token ids")
