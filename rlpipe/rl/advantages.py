"""Group-relative advantages: the rewards of one task's completions in one step -> advantages.

Methods (r = the scored rewards of the group, k = their count):
- grpo:   (r_i - mean(r)) / (std(r) + eps), with the SAMPLE std (divide by k - 1), as TRL's
          GRPOTrainer (torch.std, unbiased; 1.16) and verl (torch.std) do: advantages then
          have sample variance 1 within the group (population variance (k-1)/k).
- drgrpo: r_i - mean(r) (Dr. GRPO: no std division, so easy/hard groups are not re-weighted).
- rloo:   r_i - mean of the other k-1 rewards = k/(k-1) * (r_i - mean(r)).

Rules shared by all methods: a None reward (could not be scored) is excluded from the group
statistics and gets a None advantage; a group with a single scored reward gets 0.0; a group
whose scored rewards are all equal gets 0.0 for every member (no signal, no NaN).

This module does not drop groups (DAPO's dynamic sampling is the buffer's job) and does not
whiten across groups.
"""

from __future__ import annotations

import math
from typing import Literal

AdvantageMethod = Literal["grpo", "drgrpo", "rloo"]


def group_advantages(rewards: list[float | None], method: AdvantageMethod = "grpo", eps: float = 1e-6) -> list[float | None]:
    """Advantages of one group, aligned with `rewards` (None stays None)."""
    if method not in ("grpo", "drgrpo", "rloo"):
        raise ValueError(f"unknown advantage method {method!r}; use grpo, drgrpo or rloo")
    scored = [reward for reward in rewards if reward is not None]
    count = len(scored)
    if count <= 1 or all(reward == scored[0] for reward in scored):
        return [None if reward is None else 0.0 for reward in rewards]
    mean = sum(scored) / count
    if method == "grpo":
        std = math.sqrt(sum((reward - mean) ** 2 for reward in scored) / (count - 1))
        return [None if reward is None else (reward - mean) / (std + eps) for reward in rewards]
    if method == "drgrpo":
        return [None if reward is None else reward - mean for reward in rewards]
    total = sum(scored)
    return [None if reward is None else reward - (total - reward) / (count - 1) for reward in rewards]
