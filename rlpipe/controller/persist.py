"""Stage `persist` (stage 5 of a step, tasks/step_tasks.py): commit a step. The
rows it trains on become an immutable Parquet part under trajectories/, the rows dynamic
sampling set apart another under set_apart/ (so readers of trajectories/ see only what the
run trains on), then the manifest is written (last). A step is committed iff its manifest exists;
writing a part twice is harmless (same key, same bytes). The step's staged rows are
deleted after the commit."""

from __future__ import annotations

import time

from rlpipe.controller.runtime import Runtime
from rlpipe.core.records import Trajectory
from rlpipe.core.seeds import derive_seed
from rlpipe.rl.dynamic_sampling import select_groups
from rlpipe.rl.rollout_metrics import rollout_metrics
from rlpipe.rl.staleness import generation_version
from rlpipe.storage.lake_records import StepManifest


def persist(runtime: Runtime, step: int, rounds: list[list[Trajectory]], overlong_filtered: int = 0) -> int:
    """Commit the step from its rounds' scored rows; return the row count it trains on."""
    records = runtime.records
    run_id = runtime.run_id
    existing = records.lake.read_manifest(run_id, step)
    if existing is not None:
        return existing.rows
    config = runtime.config
    selection = select_groups(rounds, config.rollout.prompts_per_step, config.rollout.dynamic_sampling,
                              seed=derive_seed(config.seed, step, "select-groups"))  # a re-run selects the same
    part = records.lake.write_part(run_id, step, "00000", selection.trained)
    set_apart = (records.lake.write_set_apart(run_id, step, selection.set_apart),) if selection.set_apart else ()
    metrics = rollout_metrics([row for rows in rounds for row in rows])  # every generated row: the policy's reward
    if config.rollout.dynamic_sampling:
        metrics.update(selection.metrics)
    if config.algo.overlong_filter:
        metrics["rollout/overlong_filtered"] = float(overlong_filtered)
    records.lake.commit_step(
        StepManifest(
            run_id=run_id,
            step=step,
            policy_version=generation_version(step, config.rollout.max_staleness),
            parts=(part,),
            rows=part.rows,
            metrics=tuple(sorted(metrics.items())),
            committed_at_ms=int(time.time() * 1000),
            set_apart=set_apart,
        )
    )
    records.lake.clean_staged(run_id, step)  # committed: a re-run skips the step by its manifest
    return part.rows
