"""The clipped token-level policy-gradient loss of PPO/GRPO, with an optional k3 KL penalty
and optional truncated importance sampling (TIS, as verl's `tis_imp_ratio_cap`).

Per completion token t of sequence i (A_i = the sequence's advantage):

    ratio_t   = exp(new_logprob_t - old_logprob_t)
    pg_t      = -min(ratio_t * A_i, clip(ratio_t, 1 - clip_eps, 1 + clip_eps_high) * A_i)
    kl_t      = exp(ref_t - new_t) - (ref_t - new_t) - 1        (Schulman's k3 estimator)
    loss_t    = pg_t + kl_coef * kl_t

`clip_eps_high` (None: clip_eps) is DAPO's clip-higher: a wider upper bound lets a token with
A > 0 whose probability is small rise further in one update than PPO's symmetric range lets
it (at ratio 1.2 a token at 1 % stops at 1.2 %), which DAPO found slows the collapse of the
policy's samples onto one reply per prompt (on the SmolLM2 math recipe, 0.28 did not:
docs/RESULTS.md); the lower bound, which limits how far a token with A < 0 falls, stays
1 - clip_eps.

What the k3 term is, per position with its prefix held fixed (the loss does not differentiate
through which prefixes were sampled), for a token x drawn from the current policy pi: its
expected VALUE is KL(pi || ref) (what the `kl` metric reports), but its expected GRADIENT
with respect to pi's parameters is that of KL(ref || pi), the other direction:

    d kl_t / d theta = (1 - ref(x) / pi(x)) * d log pi(x) / d theta
    E_{x ~ pi}[...]  = sum_x pi(x) d log pi(x) / d theta - sum_x ref(x) d log pi(x) / d theta
                     = 0 - sum_x ref(x) d log pi(x) / d theta = d KL(ref || pi) / d theta

(sum_x pi(x) d log pi(x) = d sum_x pi(x) = 0). So as a loss it pulls pi towards covering
ref (mass-covering, the forward KL), not down the reverse KL its value estimates; both are 0
only at pi = ref and near it the two gradients agree to first order. Tokens sampled by an
older policy (later mini-batches, async rows) are not reweighted for this term, so there it
is that gradient only approximately.

Truncated importance sampling (`behaviour_logprobs` and `tis_cap` given): `old_logprob_t` is
then the TRAINER's own logprob of the token before the update (the proximal policy) and
`behaviour_t` the engine's, of the distribution that actually sampled it. The engine's
numerics (another kernel, bf16, vLLM) differ from the trainer's, so the samples are slightly
off-policy even before the first optimizer step; each token's policy-gradient term is
reweighted by the capped importance weight, a constant (no gradient flows through it):

    w_t   = min(exp(old_logprob_t - behaviour_t), tis_cap)
    pg_t  = w_t * -min(ratio_t * A_i, clip(ratio_t, ...) * A_i)

The KL term is not reweighted. Without `behaviour_logprobs` the loss is exactly the one above.

Aggregation (mask = 1 on completion tokens):
- token_mean:          sum_t mask * loss_t / (number of completion tokens)
- seq_mean_token_sum:  sum_t mask * loss_t / (number of sequences)   (sum over tokens, mean over sequences)

`normalizer` overrides the denominator so that gradient accumulation over micro-batches
gives exactly the full-batch loss: pass the token (or sequence) count of the WHOLE batch.

Metrics: clip_frac = fraction of completion tokens where the clipped branch is the one that
binds (A > 0 and ratio > 1 + eps_high, or A < 0 and ratio < 1 - eps: the gradient is zero there);
kl = mean k3 per completion token (0.0 without a reference); with TIS, tis_weight = mean w_t
and tis_capped_frac = fraction of tokens where exp(old - behaviour) > tis_cap (None without TIS).

This module does not compute logprobs (see batching.py) nor entropy (needs full logits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

LossAggregation = Literal["token_mean", "seq_mean_token_sum"]


@dataclass(frozen=True)
class LossMetrics:
    """Diagnostics of one loss evaluation (over the completion tokens it saw)."""

    clip_frac: float
    kl: float
    tokens: int
    tis_weight: float | None = None
    tis_capped_frac: float | None = None


def policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    loss_agg: LossAggregation = "token_mean",
    normalizer: float | None = None,
    behaviour_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
    clip_eps_high: float | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """Loss over [batch, tokens] logprob tensors; `advantages` is [batch]; see the module docstring."""
    high = clip_eps if clip_eps_high is None else clip_eps_high
    if clip_eps <= 0 or high <= 0:
        raise ValueError(f"the clip range must be > 0 on both sides, got clip_eps {clip_eps} and clip_eps_high {clip_eps_high}")
    if loss_agg not in ("token_mean", "seq_mean_token_sum"):
        raise ValueError(f"unknown loss_agg {loss_agg!r}; use token_mean or seq_mean_token_sum")
    if (behaviour_logprobs is None) != (tis_cap is None):
        raise ValueError("truncated importance sampling needs both behaviour_logprobs and tis_cap (or neither)")
    if tis_cap is not None and tis_cap <= 0:
        raise ValueError(f"tis_cap must be > 0, got {tis_cap}")
    mask = mask.to(new_logprobs.dtype)
    advantage = advantages.to(new_logprobs.dtype)[:, None]
    ratio = torch.exp(new_logprobs - old_logprobs)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * advantage
    per_token = -torch.minimum(unclipped, clipped)
    tis_raw = tis_weight = None
    if behaviour_logprobs is not None:
        with torch.no_grad():
            tis_raw = torch.exp(old_logprobs.to(new_logprobs.dtype) - behaviour_logprobs.to(new_logprobs.dtype))
            tis_weight = torch.clamp(tis_raw, max=tis_cap)
        per_token = per_token * tis_weight
    kl_per_token = torch.zeros_like(per_token)
    if ref_logprobs is not None:
        delta = ref_logprobs - new_logprobs
        kl_per_token = torch.exp(delta) - delta - 1.0
        per_token = per_token + kl_coef * kl_per_token
    if normalizer is None:
        normalizer = float(mask.sum()) if loss_agg == "token_mean" else float(mask.shape[0])
    loss = (per_token * mask).sum() / max(normalizer, 1.0)
    with torch.no_grad():
        tokens = int(mask.sum())
        binds = ((advantage > 0) & (ratio > 1.0 + high)) | ((advantage < 0) & (ratio < 1.0 - clip_eps))
        clip_frac = float((binds.to(mask.dtype) * mask).sum()) / max(tokens, 1)
        kl = float((kl_per_token * mask).sum()) / max(tokens, 1)
        tis_mean = tis_capped = None
        if tis_weight is not None and tis_raw is not None:
            tis_mean = float((tis_weight * mask).sum()) / max(tokens, 1)
            tis_capped = float(((tis_raw > tis_cap).to(mask.dtype) * mask).sum()) / max(tokens, 1)
    return loss, LossMetrics(clip_frac=clip_frac, kl=kl, tokens=tokens, tis_weight=tis_mean, tis_capped_frac=tis_capped)
