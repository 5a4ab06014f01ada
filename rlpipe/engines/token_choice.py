"""How the hf engine picks the next token of each row from its logits (`choose_tokens`):
greedy, or a draw by inverse CDF from one uniform number per row, over the whole vocabulary or
the top_p nucleus, with the drawn token's logprob under the distribution it was drawn from.

What it does not: run a model, hold a tokenizer, or draw the uniform numbers (the engine draws
them from its seeded generator).
"""

from __future__ import annotations

import torch

from rlpipe.engines.sampling import SamplingParams


def choose_tokens(
    logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(next token, its logprob) per row of float logits [rows, vocab].

    Greedy (`uniforms` unused, may be None): the argmax and its temperature-1 logprob.
    Sampled: a draw from softmax(logits / T), restricted to the nucleus (the smallest set of
    most likely tokens whose mass reaches top_p) when top_p < 1, by inverse CDF with the row's
    uniform number in [0, 1); and the logprob of the drawn token under that same distribution:
    log_softmax(logits / T) minus the log of the nucleus' mass (0 when top_p = 1)."""
    if params.greedy:
        tokens = logits.argmax(dim=-1)
        return tokens, torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    if uniforms is None:
        raise ValueError("sampling (greedy=False) needs one uniform number per row")
    logprobs = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = logprobs.exp()
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)
        tokens = order.gather(1, _inverse_cdf(sorted_probs, uniforms)[:, None])[:, 0]
        log_mass = torch.log(sorted_probs.sum(dim=-1))
    else:
        tokens = _inverse_cdf(probs, uniforms)
        log_mass = torch.zeros_like(uniforms, dtype=logprobs.dtype)
    return tokens, logprobs.gather(1, tokens[:, None])[:, 0] - log_mass


def _inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the index i with cdf[i-1] <= u * total < cdf[i] (P(i) = weight_i / total): a
    zero-weight index is never chosen (its cdf step is empty), and when rounding puts
    u * total at the total, the last index with weight is."""
    cdf = weights.cumsum(dim=-1)
    totals = cdf[:, -1:].contiguous()
    chosen = torch.searchsorted(cdf, uniforms[:, None].to(cdf.dtype) * totals, right=True)
    last_with_weight = torch.searchsorted(cdf, totals, right=False)
    return torch.minimum(chosen, last_with_weight)[:, 0]
