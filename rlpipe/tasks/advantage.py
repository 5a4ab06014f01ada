"""Stage task `advantages`: group the step's verified rows by task, compute advantages."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from prefect import task

from rlpipe.core.records import Trajectory
from rlpipe.rl.advantages import group_advantages
from rlpipe.tasks.runtime import get_runtime
from rlpipe.tasks.stage_options import STAGE_OPTIONS, stage_cache_key


@task(name="advantages", task_run_name="advantages-step-{step}", cache_key_fn=stage_cache_key, **STAGE_OPTIONS)
def advantages(run_id: str, step: int, staged_uri: str) -> str:
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
    return runtime.lake.write_staged(run_id, step, "advantages", scored)
