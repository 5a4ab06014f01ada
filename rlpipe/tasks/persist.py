"""Stage task `persist`: write the step's rows as an immutable Parquet part, then its
manifest (last). A step is committed iff its manifest exists; writing the part twice is
harmless (same key, same bytes)."""

from __future__ import annotations

import time

from prefect import task

from rlpipe.rl.rollout_metrics import rollout_metrics
from rlpipe.storage.lake_records import StepManifest
from rlpipe.tasks.runtime import get_runtime
from rlpipe.tasks.stage_options import UNCACHED_STAGE_OPTIONS


@task(name="persist", task_run_name="persist-step-{step}", **UNCACHED_STAGE_OPTIONS)
def persist(run_id: str, step: int, staged_uri: str) -> int:
    """Commit the step; return its row count."""
    runtime = get_runtime(run_id)
    existing = runtime.lake.read_manifest(run_id, step)
    if existing is not None:
        return existing.rows
    rows = runtime.lake.read_staged(staged_uri)
    part = runtime.lake.write_part(run_id, step, "00000", rows)
    metrics = rollout_metrics(rows)
    runtime.lake.commit_step(
        StepManifest(
            run_id=run_id,
            step=step,
            policy_version=runtime.policy_version,
            parts=(part,),
            rows=part.rows,
            metrics=tuple(sorted(metrics.items())),
            committed_at_ms=int(time.time() * 1000),
        )
    )
    runtime.lake.clean_staged(run_id, step)  # committed: a re-run skips the step by its manifest
    return part.rows
