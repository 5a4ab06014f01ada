"""Stage `update` (stage 6 of a step, tasks/step_tasks.py): one policy update on a
committed step's rows, in the trainer worker. The worker reads the step's rows back from the
committed part itself (this sends the manifest's part references, never rows), so the same
code replays a step on resume. Updates are idempotent by policy version: the worker skips an
update it has applied, so a retried task never applies it twice. The controller's policy
version is the one the trainer acknowledged.

Not here: the update's maths (rl/trainer.py, in workers/trainer_worker.py), the weight sync
after it (controller/weight_sync.py).
"""

from __future__ import annotations

from rlpipe.controller.runtime import Runtime
from rlpipe.core.seeds import derive_seed


def apply_committed_update(runtime: Runtime, step: int) -> dict[str, float]:
    """Apply the policy update of committed step `step` (policy version step-1 -> step); the
    update's metrics (those of the update that applied it, when it was applied already in
    this process)."""
    progress = runtime.progress
    if progress.policy_version >= step:
        return dict(progress.update_metrics.get(step, {}))
    if progress.policy_version != step - 1:
        raise ValueError(f"update of step {step} needs policy version {step - 1}, have {progress.policy_version}")
    manifest = runtime.records.lake.read_manifest(runtime.run_id, step)
    if manifest is None:
        raise ValueError(f"step {step} of run {runtime.run_id} is not committed; nothing to update from")
    shuffle_seed = derive_seed(runtime.config.seed, step, "mini-batches")  # replay shuffles the same
    result = runtime.workers.trainer.update(step, manifest.parts, shuffle_seed)
    progress.policy_version = result.policy_version
    progress.update_metrics = {step: dict(result.metrics)}  # the last update's, for a retried `train`
    return result.metrics
