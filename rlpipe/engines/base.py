"""The RolloutEngine protocol and its sampling parameters.

A rollout engine turns (task_id, prompt text) pairs into Completions: `n` samples per
prompt, each with its token ids and the per-token logprobs the trainer needs for the PPO
importance ratio. Backends today: hf (transformers, in-process). vLLM and OpenAI-compatible
HTTP backends implement the same protocol later.

Logprob convention (every backend, trajectory schema version 2): `Completion.logprobs[i]` is
the log-probability of the sampled token `token_ids[i]` under the distribution it was
actually drawn from: `log_softmax(logits / T)` at the sampling temperature T, and with
top_p < 1 the nucleus renormalised (log p_T(token) - log of the nucleus' mass under p_T).
The trainer recomputes `log_softmax(logits / T)` at the same T (`rl.batching.token_logprobs`),
so the ratio new/old of an unchanged policy is 1 and the clip range is that of the
sampling policy, as in TRL and verl. Known limit: with top_p < 1 the trainer does not
rebuild the nucleus (it is not a differentiable function of the weights), so its logprob of
a token is below the stored one by the log of the nucleus mass and the ratio starts below 1;
keep top_p = 1 for training until truncated importance sampling lands. Greedy completions
(held-out evaluation, `greedy=True`) store `log_softmax(logits)` at temperature 1 of the
argmax token: a diagnostic of the policy's confidence, never trained on. Schema version 1
stored temperature-1 logprobs also for sampled completions; such runs are not resumed.

Stop convention: the text is cut before the first stop string; the token that completed the
stop string (or the EOS token) is kept as the last entry of `token_ids`/`logprobs`, so the
policy is trained to emit it. finish_reason is "stop" for a stop string or EOS, "length"
when max_new_tokens ran out.

This module does not sample, hold a model or touch a device.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from rlpipe.core.records import Completion


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: `n` completions per prompt; `greedy` ignores temperature/top_p (held-out eval)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8
    stop: tuple[str, ...] = ()
    seed: int = 0
    greedy: bool = False

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature} (use greedy=True for argmax)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(not stop for stop in self.stop):
            raise ValueError("stop strings must be non-empty")


PromptFormat = Literal["plain", "chat"]


def encode_prompt(tokenizer: Any, text: str, prompt_format: PromptFormat = "plain") -> tuple[int, ...]:
    """The token ids an engine feeds for a task's prompt text: the text itself without special
    tokens (plain), or the text as one user message through the tokenizer's chat template with
    the assistant turn opened (chat). Every engine encodes with this function, and the ids go
    into the trajectory (`prompt_token_ids`), so the trainer scores exactly what was sampled."""
    if prompt_format == "plain":
        return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("model.prompt_format = 'chat' needs a tokenizer with a chat template; this one has none (use 'plain')")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tuple(tokenizer(rendered, add_special_tokens=False)["input_ids"])


class RolloutEngine(Protocol):
    """Samples completions from its own copy of the policy; weights arrive by `load_weights`."""

    @property
    def policy_version(self) -> int:
        """Version of the weights the engine samples with (0 = initial)."""
        ...

    def generate(self, prompts: list[tuple[str, str]], params: SamplingParams) -> list[Completion]:
        """`params.n` completions per (task_id, prompt) pair, prompt-major, sample_idx 0..n-1."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], policy_version: int) -> None:
        """Copy new weights (names as in the trainer model's named_parameters) into the engine."""
        ...
