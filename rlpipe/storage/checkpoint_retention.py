"""Which checkpoints a run keeps, and what they are (size, held-out accuracy).

A run keeps, of its complete checkpoints:
  - the `keep_last` newest (checkpoint.keep_last; 0 keeps every checkpoint);
  - the best: the highest held-out accuracy among checkpoints that an evaluation scored
    (evals/*.json in the lake, whose `policy_version` is the checkpoint's step; ties: the
    newer), when evaluations ran;
  - what a resume restores from: the newest checkpoint at or before the last committed step
    minus rollout.max_staleness (tasks/lifecycle.py `restore`: a pipelined run restores k
    steps behind the last commit), so pruning never takes the checkpoint a resume, or a
    fresh trainer worker after a crash, would load;
  - checkpoint 0 when algo.kl_coef > 0: the KL reference is loaded from it on a resume.
Everything else is deleted, and only after a newer checkpoint is committed (the writer
prunes right after each commit; the newest is always kept). A resume of a corrupted newest
checkpoint falls back to the older ones that are still kept.

What it does not: write or load checkpoints (storage/checkpoint_store.py), decide when to
save (flows/), or keep a "best" without evaluations (there is none to rank).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow.fs as pafs

from rlpipe.storage.lake import Lake


@dataclass(frozen=True)
class RetentionRule:
    keep_last: int  # 0: keep every checkpoint
    max_staleness: int  # a resume restores to the last committed step minus this
    keep_reference: bool  # checkpoint 0 holds the KL reference (algo.kl_coef > 0)


@dataclass(frozen=True)
class KeptCheckpoint:
    """A complete checkpoint of a run: its size, its held-out accuracy (None when no
    evaluation scored its step), why retention keeps it, and what writing it took (None
    when its CHECKPOINT.json does not say)."""

    step: int
    size_bytes: int
    accuracy: float | None
    reasons: tuple[str, ...]  # "last", "best", "resume", "reference", "all"
    write_s: float | None = None
    write_cpu_s: float | None = None


def evaluated_accuracies(lake: Lake, run_id: str) -> dict[int, float]:
    """policy version -> held-out accuracy, from the run's stored evaluations (the newest
    document wins when two scored the same version)."""
    found: list[tuple[int, int, float]] = []  # (mtime, version, accuracy)
    for info in lake.objects.list(f"runs/{run_id}/evals"):
        if info.type != pafs.FileType.File or not info.base_name.endswith(".json"):
            continue
        data = lake.objects.get(f"runs/{run_id}/evals/{info.base_name}")
        try:
            document = json.loads(data.decode()) if data else {}
            found.append((int(info.mtime_ns or 0), int(document["policy_version"]), float(document["accuracy"])))
        except (ValueError, KeyError, TypeError):
            continue  # not an evaluation document
    return {version: accuracy for _, version, accuracy in sorted(found)}


def best_step(steps: list[int], accuracies: dict[int, float]) -> int | None:
    """The step of `steps` with the highest accuracy (ties: the newer); None when none was scored."""
    scored = [(accuracies[step], step) for step in steps if step in accuracies]
    return max(scored)[1] if scored else None


def kept_reasons(steps: list[int], committed_last: int | None, accuracies: dict[int, float], rule: RetentionRule) -> dict[int, tuple[str, ...]]:
    """step -> why it is kept, for the complete checkpoints `steps` (ascending); a step
    missing from the result is deleted."""
    reasons: dict[int, list[str]] = {}
    if rule.keep_last == 0:
        for step in steps:
            reasons.setdefault(step, []).append("all")
    for step in steps[-rule.keep_last:] if rule.keep_last else ():
        reasons.setdefault(step, []).append("last")
    best = best_step(steps, accuracies)
    if best is not None:
        reasons.setdefault(best, []).append("best")
    if committed_last is not None:
        target = max(0, committed_last - rule.max_staleness)
        restore = max((step for step in steps if step <= target), default=None)
        if restore is not None:
            reasons.setdefault(restore, []).append("resume")
    if rule.keep_reference and 0 in steps:
        reasons.setdefault(0, []).append("reference")
    return {step: tuple(why) for step, why in sorted(reasons.items())}


def prune_checkpoints(lake: Lake, run_id: str, rule: RetentionRule) -> list[int]:
    """Delete the complete checkpoints that `rule` does not keep; return their steps."""
    steps = lake.checkpoints.steps(run_id)
    committed = lake.committed_steps(run_id)
    keep = kept_reasons(steps, committed[-1] if committed else None, evaluated_accuracies(lake, run_id), rule)
    removed = [step for step in steps if step not in keep and step < steps[-1]]
    for step in removed:
        lake.checkpoints.delete(run_id, step)
    return removed


def kept_checkpoints(lake: Lake, run_id: str, rule: RetentionRule) -> list[KeptCheckpoint]:
    """The run's complete checkpoints with size, accuracy and why each is kept (`rlpipe runs
    show`, `rlpipe export --best`)."""
    steps = lake.checkpoints.steps(run_id)
    committed = lake.committed_steps(run_id)
    accuracies = evaluated_accuracies(lake, run_id)
    reasons = kept_reasons(steps, committed[-1] if committed else None, accuracies, rule)
    result = []
    for step in steps:
        info = lake.checkpoints.info(run_id, step)
        size = sum(file.size_bytes for file in info.files) if info else 0
        result.append(KeptCheckpoint(step, size, accuracies.get(step), reasons.get(step, ()),
                                     info.write_s if info else None, info.write_cpu_s if info else None))
    return result


def rule_of(config) -> RetentionRule:
    """The retention rule of a RunConfig."""
    return RetentionRule(keep_last=config.checkpoint.keep_last, max_staleness=config.rollout.max_staleness,
                         keep_reference=config.algo.kl_coef > 0)
