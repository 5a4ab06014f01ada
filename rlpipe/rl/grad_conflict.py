"""Gradient conflict between domains: the cosine similarity of the per-domain policy
gradients of one step's batch, per pair of domains. Near 1: the domains pull the policy the
same way; near 0: unrelated; below 0: learning one unlearns the other.

`gradient_conflict(gradient_of, samples_by_domain)` takes each domain's gradient with
`gradient_of` (Trainer.policy_gradient: autograd.grad at the current weights, nothing
stepped or accumulated, so the update that follows is unchanged) and returns
`grad_conflict/<a>__<b>` (names sorted, a < b). A domain whose gradient is zero (every
advantage 0: its groups all passed or all failed) has no direction: its pairs are left out.

Cost: one backward pass over the step's batch, and one float32 gradient vector per domain
held at once (4 bytes x trainable parameters x domains).

What it does not: decide when to run (the trainer worker, every eval.grad_conflict_every_steps
steps) or log anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from rlpipe.rl.batching import TrainSample

PREFIX = "grad_conflict/"


def pairwise_cosines(gradients: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """`<a>__<b>` -> cos(g_a, g_b) in float64 for each pair of names a < b whose gradients are nonzero."""
    names = sorted(name for name, gradient in gradients.items() if bool(torch.any(gradient != 0)))
    vectors = {name: gradients[name].double() for name in names}
    norms = {name: torch.linalg.vector_norm(vector) for name, vector in vectors.items()}
    cosines = {}
    for index, first in enumerate(names):
        for second in names[index + 1:]:
            cosine = torch.dot(vectors[first], vectors[second]) / (norms[first] * norms[second])
            cosines[f"{first}__{second}"] = float(cosine.clamp(-1.0, 1.0))
    return cosines


def gradient_conflict(gradient_of: Callable[[list[TrainSample]], torch.Tensor],
                      samples_by_domain: Mapping[str, list[TrainSample]]) -> dict[str, float]:
    """`grad_conflict/<a>__<b>` for the domains of the batch (fewer than two: nothing)."""
    if len([name for name, samples in samples_by_domain.items() if samples]) < 2:
        return {}
    gradients = {name: gradient_of(samples) for name, samples in sorted(samples_by_domain.items()) if samples}
    return {f"{PREFIX}{pair}": cosine for pair, cosine in pairwise_cosines(gradients).items()}
