"""Log-probabilities of target tokens through the LM head in chunks of positions, with the
vocabulary logits recomputed in the backward pass instead of kept.

Why: log p_T(target) at a position is `logits[target] / T - logsumexp(logits / T)` over the
whole vocabulary (49152 entries for SmolLM2). Computed the plain way, autograd keeps the
[positions, vocab] float32 logits (or their scaled copy) of the whole micro-batch for the
backward pass, and the backward pass makes several more tensors of that size (softmax,
the scattered target gradient, their sum); at 32 sequences x ~20 kept positions that is
~0.13 GB per copy, ~0.5 GB at the backward's start. Here the forward pass keeps only the
LM head's input (the final hidden states, which the model keeps anyway), the targets and one
logsumexp per position; the backward pass recomputes each chunk's logits, so at most one
chunk's [chunk, vocab] tensors exist at a time. The extra work is one more LM-head matmul
over the kept positions (a few percent of a training forward + backward).

The result and its gradients are those of the plain computation up to float rounding
(tests/rl/test_chunked_logprobs.py): the same `logits = hidden @ W.T (+ b)` in the head's
dtype, then float32, divided by T, gather - logsumexp; the backward pass is the analytic
gradient `(onehot(target) - softmax(logits / T)) / T * grad`, cast to the head's dtype for
the two matmuls as autograd would.

`supports_chunked_logprobs(model)`: only models whose causal-LM forward is exactly
`lm_head(decoder(...).last_hidden_state)` with a plain nn.Linear head (llama, qwen2, qwen3,
mistral; a peft LoRA wrapper of them whose head is not adapted); any other model (logit
soft-capping, logit scales) goes through its own forward (rl/batching.py decides).

What it does not: sample, pad, or pick the positions (rl/batching.py does).
"""

from __future__ import annotations

import torch

PLAIN_HEAD_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
"""transformers model types whose ForCausalLM.forward computes logits as lm_head(last_hidden_state) only."""


def supports_chunked_logprobs(model: torch.nn.Module) -> bool:
    """Whether `model`'s logits are exactly its output Linear applied to its decoder's last
    hidden state (see the module docstring)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return False
    try:
        head, decoder = model.get_output_embeddings(), model.get_decoder()
    except (AttributeError, NotImplementedError):
        return False
    return type(head) is torch.nn.Linear and decoder is not None and decoder is not model


def decoder_hidden_states(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The decoder's final (normalised) hidden states [batch, length, hidden]; no KV cache."""
    return model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state


def chunked_target_logprobs(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, temperature: float,
                            chunk_positions: int) -> torch.Tensor:
    """log softmax(head(hidden) / T)[target] per position: [..., hidden] and [...] targets ->
    [...] float32, `chunk_positions` positions' logits at a time (forward and backward)."""
    if chunk_positions < 1:
        raise ValueError(f"chunk_positions must be >= 1, got {chunk_positions}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    shape = targets.shape
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1)
    values = _TargetLogprobs.apply(flat_hidden, head.weight, head.bias, flat_targets, float(temperature), int(chunk_positions))
    return values.reshape(shape)


def _scaled_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """float32 logits / T of some positions, as the plain path computes them."""
    scaled = torch.nn.functional.linear(hidden, weight, bias).float()
    return scaled / temperature if temperature != 1.0 else scaled


class _TargetLogprobs(torch.autograd.Function):
    """See the module docstring; keeps hidden, targets and the logsumexp per position."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                temperature: float, chunk: int) -> torch.Tensor:
        values = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(values)
        for start in range(0, hidden.shape[0], chunk):
            end = start + chunk
            scaled = _scaled_logits(hidden[start:end], weight, bias, temperature)
            lse[start:end] = torch.logsumexp(scaled, dim=-1)
            values[start:end] = scaled.gather(-1, targets[start:end, None])[:, 0] - lse[start:end]
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        return values

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN205 - autograd's tuple of gradients
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_bias and bias is not None else None
        grad = grad.float()
        for start in range(0, hidden.shape[0], ctx.chunk):
            end = start + ctx.chunk
            part = hidden[start:end]
            scaled = _scaled_logits(part, weight, bias, ctx.temperature)
            softmax = torch.exp(scaled.sub_(lse[start:end, None]))  # in place: one [chunk, vocab] tensor at a time
            rows = grad[start:end, None]
            d_logits = softmax.mul_(rows).neg_()
            d_logits.scatter_add_(-1, targets[start:end, None], rows)
            if ctx.temperature != 1.0:
                d_logits.div_(ctx.temperature)
            d_logits = d_logits.to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[start:end] = d_logits @ weight
            if grad_weight is not None:  # accumulated in float32 over the chunks
                grad_weight.addmm_(d_logits.t().float(), part.float())
            if grad_bias is not None:
                grad_bias += d_logits.float().sum(dim=0)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None
