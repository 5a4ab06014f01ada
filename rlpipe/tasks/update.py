"""Stage tasks `update` (one policy update on a committed step's rows, in the trainer
worker) and `sync` (the trainer's weights into the engine worker).

The trainer worker reads the step's rows back from the committed part itself (the task
sends the manifest's part references, never rows), so the same code replays a step on
resume. Updates are idempotent by policy version: the worker skips an update it has
applied, so a retried task never applies it twice. The controller's policy version is the
one the trainer acknowledged.
"""

from __future__ import annotations

from prefect import task

from rlpipe.core.seeds import derive_seed
from rlpipe.tasks.runtime import Runtime, get_runtime, sync_weights
from rlpipe.tasks.stage_options import UNCACHED_STAGE_OPTIONS


def apply_committed_update(runtime: Runtime, step: int) -> dict[str, float]:
    """Apply the policy update of committed step `step` (policy version step-1 -> step)."""
    if runtime.policy_version >= step:
        return {}
    if runtime.policy_version != step - 1:
        raise ValueError(f"update of step {step} needs policy version {step - 1}, have {runtime.policy_version}")
    manifest = runtime.lake.read_manifest(runtime.run_id, step)
    if manifest is None:
        raise ValueError(f"step {step} of run {runtime.run_id} is not committed; nothing to update from")
    shuffle_seed = derive_seed(runtime.config.seed, step, "mini-batches")  # replay shuffles the same
    result = runtime.trainer.update(step, manifest.parts, shuffle_seed)
    runtime.policy_version = result.policy_version
    return result.metrics


@task(name="update", task_run_name="update-step-{step}", **UNCACHED_STAGE_OPTIONS)
def update(run_id: str, step: int) -> dict[str, float]:
    return apply_committed_update(get_runtime(run_id), step)


@task(name="sync", task_run_name="sync-step-{step}", **UNCACHED_STAGE_OPTIONS)
def sync(run_id: str, step: int) -> dict[str, float]:
    """Load the trainer's weights into the engine (unless it serves them already); returns
    `sync/seconds` (publish + load, 0 when nothing was to do) and the engine's version."""
    runtime = get_runtime(run_id)
    seconds = 0.0
    if runtime.engine_version != runtime.policy_version:
        seconds = sync_weights(runtime)
    return {"sync/seconds": seconds, "sync/policy_version": float(runtime.engine_version)}
