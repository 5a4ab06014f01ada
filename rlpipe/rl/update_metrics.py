"""What one trainer update reports (`UpdateMetrics`, and `TisUpdateMetrics` with truncated
importance sampling): typed records the trainer returns and the trainer worker turns into
`train/*` metrics.

What it does not: compute anything (rl/trainer.py does).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class UpdateMetrics:
    """What one `update` did. loss/kl/clip_frac/grad_norm are means over its optimizer steps
    (every mini-batch of every epoch); grad_norm is the pre-clip norm, grad_norm_max the
    largest of them; tokens = completion tokens of the scored samples."""

    loss: float
    kl: float
    grad_norm: float
    grad_norm_max: float
    clip_frac: float
    tokens: int

    def as_floats(self) -> dict[str, float]:
        """Every metric as a float, by field name (TisUpdateMetrics adds its two)."""
        return {name: float(value) for name, value in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class TisUpdateMetrics(UpdateMetrics):
    """An update with truncated importance sampling: also the token means of the TIS weight
    and of the tokens whose weight was capped. A subclass, so that a run without TIS reports
    exactly the fields it always did."""

    tis_weight: float
    tis_capped_frac: float
