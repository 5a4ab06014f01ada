"""HFEngine: the transformers rollout backend (CPU or one GPU, in-process).

What it does: holds its OWN copy of the policy (deep-copied at construction, so the
trainer's in-place updates never leak into sampling); samples `n` completions per prompt in
left-padded batches with a KV cache (`cache=DynamicCache()`), in a hand-written decode loop
that reads each sampled token's logprob from the very distribution it was drawn from
(temperature and top-p applied) and ends a batch as soon as every row has finished; stops
on stop strings and EOS (see engines/base.py for the logprob and stop conventions). On the tiny CPU models of
the quickstart one batch of 128 short completions takes a few tens of milliseconds.
Sampling is deterministic for a given `SamplingParams.seed`, the same prompts and the same
batch_size (one torch.Generator drives every draw).

What it does not: tensor parallelism, continuous batching, chat templates (prompts are plain
text, encoded without special tokens), or prefix sharing between the n samples of a prompt.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from rlpipe.core.records import Completion
from rlpipe.engines.base import PromptFormat, SamplingParams, encode_prompt


class HFEngine:
    """Rollouts from a private copy of a transformers causal LM."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int = 128, device: str = "cpu",
        prompt_format: PromptFormat = "plain",
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._model = copy.deepcopy(model).to(device).eval()
        self._model.requires_grad_(False)
        self._tokenizer = tokenizer
        self._batch_size = batch_size
        self._device = torch.device(device)
        self._eos_id = tokenizer.eos_token_id
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (self._eos_id or 0)
        self._policy_version = 0
        self._prompt_format = prompt_format

    @property
    def policy_version(self) -> int:
        return self._policy_version

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], policy_version: int) -> None:
        """Copy tensors into the engine's parameters by name; unknown names raise ValueError."""
        parameters = dict(self._model.named_parameters())
        for name, tensor in named_tensors:
            if name not in parameters:
                raise ValueError(f"engine model has no parameter {name!r}; weight names must match the trainer model's")
            parameters[name].copy_(tensor.detach().to(parameters[name].device, parameters[name].dtype))
        self._policy_version = policy_version

    def generate(self, prompts: list[tuple[str, str]], params: SamplingParams) -> list[Completion]:
        """`params.n` completions per prompt, in prompt order then sample_idx order."""
        generator = torch.Generator(device=self._device).manual_seed(params.seed)
        encoded = [encode_prompt(self._tokenizer, prompt, self._prompt_format) for _, prompt in prompts]
        rows = [(task_index, sample_idx) for task_index in range(len(prompts)) for sample_idx in range(params.n)]
        completions: list[Completion] = []
        for start in range(0, len(rows), self._batch_size):
            chunk = rows[start : start + self._batch_size]
            sampled = self._sample_batch([encoded[task_index] for task_index, _ in chunk], params, generator)
            for (task_index, sample_idx), (text, token_ids, logprobs, finish_reason) in zip(chunk, sampled):
                completions.append(
                    Completion(
                        task_id=prompts[task_index][0],
                        sample_idx=sample_idx,
                        text=text,
                        prompt_token_ids=encoded[task_index],
                        token_ids=token_ids,
                        logprobs=logprobs,
                        finish_reason=finish_reason,
                        policy_version=self._policy_version,
                    )
                )
        return completions

    @torch.no_grad()
    def _sample_batch(
        self, prompt_ids: list[tuple[int, ...]], params: SamplingParams, generator: torch.Generator
    ) -> list[tuple[str, tuple[int, ...], tuple[float, ...], str]]:
        """Decode one left-padded batch; returns (text, token_ids, logprobs, finish_reason) per row."""
        batch = len(prompt_ids)
        width = max(len(ids) for ids in prompt_ids)
        input_ids = torch.full((batch, width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((batch, width), dtype=torch.long)
        for row, ids in enumerate(prompt_ids):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        input_ids, attention_mask = input_ids.to(self._device), attention_mask.to(self._device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        texts = [""] * batch
        finish = [""] * batch
        for _ in range(params.max_new_tokens):
            output = self._model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache, use_cache=True)
            logits = output.logits[:, -1, :].float()
            next_tokens, token_logprobs = choose_tokens(logits, params, generator)
            for row, (token, logprob) in enumerate(zip(next_tokens.tolist(), token_logprobs.tolist())):
                if finish[row]:
                    continue
                tokens[row].append(token)
                logprobs[row].append(logprob)
                finish[row], texts[row] = self._check_stop(tokens[row], token, params.stop)
            if all(finish):
                break
            next_tokens = torch.where(torch.tensor([bool(f) for f in finish], device=self._device), self._pad_id, next_tokens)
            input_ids = next_tokens[:, None]
            attention_mask = torch.cat([attention_mask, torch.ones((batch, 1), dtype=torch.long, device=self._device)], dim=1)
            position_ids = position_ids[:, -1:] + 1
        return [(texts[row], tuple(tokens[row]), tuple(logprobs[row]), finish[row] or "length") for row in range(batch)]

    def _check_stop(self, token_ids: list[int], last_token: int, stop: tuple[str, ...]) -> tuple[str, str]:
        """(finish_reason or "", text so far cut before the first stop string)."""
        if last_token == self._eos_id:
            return "stop", self._tokenizer.decode(token_ids[:-1], skip_special_tokens=True)
        text = self._tokenizer.decode(token_ids, skip_special_tokens=True)
        cut = min((index for index in (text.find(s) for s in stop) if index >= 0), default=-1)
        if cut >= 0:
            return "stop", text[:cut]
        return "", text


def choose_tokens(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(next token, its logprob) per row of float logits [batch, vocab].

    Greedy: the argmax and its temperature-1 logprob. Sampled: a draw from softmax(logits / T),
    restricted to the nucleus (the smallest set of most likely tokens whose mass reaches
    top_p) when top_p < 1, and the logprob of the drawn token under that same distribution:
    log_softmax(logits / T) minus the log of the nucleus' mass (0 when top_p = 1)."""
    if params.greedy:
        tokens = logits.argmax(dim=-1)
        return tokens, torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    scaled = logits / params.temperature
    probs = torch.softmax(scaled, dim=-1)
    log_mass = torch.zeros(logits.shape[0], dtype=logits.dtype, device=logits.device)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(1, order, sorted_probs)
        log_mass = torch.log(sorted_probs.sum(dim=-1))
    tokens = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return tokens, torch.log_softmax(scaled, dim=-1).gather(1, tokens[:, None])[:, 0] - log_mass
