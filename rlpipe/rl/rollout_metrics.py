"""Metrics of one step's verified rollouts: reward overall and per domain, rates of each
verdict reason, completion lengths. Pure: no I/O, no tracking client."""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean

from rlpipe.core.records import Trajectory, VerdictReason


def rollout_metrics(rows: list[Trajectory]) -> dict[str, float]:
    """`reward/mean`, `reward/<domain>`, `verify/<reason>_rate`, `rollout/*` of one step.

    Rows whose reward is None (could not be scored) are left out of reward means.
    """
    scored = [row for row in rows if row.verdict is not None and row.verdict.reward is not None]
    metrics: dict[str, float] = {
        "reward/mean": fmean(row.verdict.reward for row in scored) if scored else 0.0,
        "rollout/completions": float(len(rows)),
        "rollout/unscored": float(len(rows) - len(scored)),
        "rollout/mean_tokens": fmean(len(row.completion.token_ids) for row in rows) if rows else 0.0,
        "rollout/tokens": float(sum(len(row.completion.token_ids) for row in rows)),
    }
    by_domain: dict[str, list[float]] = defaultdict(list)
    for row in scored:
        by_domain[row.task.domain].append(row.verdict.reward)
    for domain, rewards in sorted(by_domain.items()):
        metrics[f"reward/{domain}"] = fmean(rewards)
    for reason in (VerdictReason.TIMEOUT, VerdictReason.FORMAT, VerdictReason.CRASH, VerdictReason.OOM,
                   VerdictReason.SANDBOX_ERROR):
        count = sum(1 for row in rows if row.verdict is not None and row.verdict.reason == reason)
        metrics[f"verify/{reason.value}_rate"] = count / len(rows) if rows else 0.0
    groups: dict[str, set[float]] = defaultdict(set)
    for row in scored:
        groups[row.task.task_id].add(row.verdict.reward)
    metrics["rollout/all_equal_group_rate"] = (
        sum(1 for rewards in groups.values() if len(rewards) == 1) / len(groups) if groups else 0.0
    )
    return metrics
