"""The RolloutEngine protocol (its sampling parameters and prompt encoding: engines/sampling.py).

A rollout engine turns (task_id, prompt text) pairs into Completions: `n` samples per
prompt, each with its token ids and the per-token logprobs the trainer needs for the PPO
importance ratio. Backends: hf (transformers), vllm and openai (an OpenAI-compatible server),
each inside the engine worker (workers/engine_worker.py).

Logprob convention (every backend, trajectory schema version 2): `Completion.logprobs[i]` is
the log-probability of the sampled token `token_ids[i]` under the distribution it was
actually drawn from: `log_softmax(logits / T)` at the sampling temperature T, and with
top_p < 1 the nucleus renormalised (log p_T(token) - log of the nucleus' mass under p_T).
The trainer recomputes `log_softmax(logits / T)` at the same T (`rl.batching.token_logprobs`),
so the ratio new/old of an unchanged policy is 1 and the clip range is that of the
sampling policy, as in TRL and verl. With top_p < 1 the trainer does not rebuild the
nucleus (it is not a differentiable function of the weights), so its logprob of a token is
below the stored one by the log of the nucleus mass: the ratio starts below 1 and clipping
drops most negative-advantage tokens. Truncated importance sampling does not make it right:
its ratio starts at 1 (the denominator is the trainer's own logprob), but each token is
weighted by the nucleus mass and the tokens outside the nucleus are never sampled, so the
update still does not estimate the gradient of the policy the trainer computes. A training
run therefore refuses rollout.top_p < 1 (controller/preflight.py, check_engine_options); evaluation
samples with top_p < 1 freely, its logprobs are never trained on. Greedy completions
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
from typing import Protocol

import torch

from rlpipe.core.records import Completion
from rlpipe.engines.sampling import SamplingParams


class RolloutEngine(Protocol):
    """Samples completions from its own copy of the policy; weights arrive by `load_weights`."""

    @property
    def policy_version(self) -> int:
        """Version of the weights the engine samples with (0 = initial)."""
        ...

    @property
    def tokenizer(self) -> object:
        """The tokenizer the engine encodes prompts with (a policy agent's chat is rendered with it)."""
        ...

    def generate(self, prompts: list[tuple[str, str]], params: SamplingParams) -> list[Completion]:
        """`params.n` completions per (task_id, prompt) pair, prompt-major, sample_idx 0..n-1."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], policy_version: int) -> None:
        """Copy new weights (names as in the trainer model's named_parameters) into the engine."""
        ...
