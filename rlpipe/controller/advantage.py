"""Stage `advantages` (stage 4 of a step, tasks/step_tasks.py): group a round's
verified rows by task, compute advantages (and, with algo.overlong_filter, leave truncated
completions out of the loss). A pure function of the verified rows: never staged, a retry
computes it again."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

from rlpipe.controller.runtime import Runtime
from rlpipe.core.records import Trajectory
from rlpipe.rl.advantages import group_advantages
from rlpipe.rl.dynamic_sampling import filter_overlong, groups_of, has_signal


@dataclass(frozen=True)
class ScoredRound:
    """What the advantages stage hands on: the round's scored rows and its group counts,
    from which the step decides whether dynamic sampling needs another round."""

    rows: list[Trajectory]
    groups: int
    groups_with_signal: int
    overlong_filtered: int = 0


def advantages(runtime: Runtime, rows: list[Trajectory]) -> ScoredRound:
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for row in rows:
        groups[row.task.task_id].append(row)
    scored: list[Trajectory] = []
    for group in groups.values():
        values = group_advantages([row.verdict.reward for row in group], runtime.config.algo.advantage)
        scored.extend(dataclasses.replace(row, advantage=value) for row, value in zip(group, values))
    scored.sort(key=lambda row: (row.task.task_id, row.completion.sample_idx))
    cut = 0
    if runtime.config.algo.overlong_filter:
        scored, cut = filter_overlong(scored)
    grouped = groups_of(scored)
    return ScoredRound(scored, len(grouped), sum(has_signal(group) for group in grouped), cut)
