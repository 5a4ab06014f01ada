"""Stage task `advantages`: group a round's verified rows by task, compute advantages
(and, with algo.overlong_filter, leave truncated completions out of the loss)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

from prefect import task

from rlpipe.core.records import Trajectory
from rlpipe.rl.advantages import group_advantages
from rlpipe.rl.dynamic_sampling import filter_overlong, groups_of, has_signal
from rlpipe.tasks.runtime import get_runtime
from rlpipe.tasks.stage_options import STAGE_OPTIONS, stage_cache_key


@dataclass(frozen=True)
class ScoredRound:
    """What the advantages stage hands on: the staged rows' URI and the round's group
    counts, from which the step decides whether dynamic sampling needs another round."""

    uri: str
    groups: int
    groups_with_signal: int
    overlong_filtered: int = 0


@task(name="advantages", task_run_name="advantages-step-{step}", cache_key_fn=stage_cache_key, **STAGE_OPTIONS)
def advantages(run_id: str, step: int, staged_uri: str, round_: int = 0) -> ScoredRound:
    runtime = get_runtime(run_id)
    rows = runtime.lake.read_staged(staged_uri)
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
    uri = runtime.lake.write_staged(run_id, step, "advantages" if round_ == 0 else f"advantages-round-{round_}", scored)
    grouped = groups_of(scored)
    return ScoredRound(uri, len(grouped), sum(has_signal(group) for group in grouped), cut)
