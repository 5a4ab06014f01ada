"""Stage tasks `update` (one optimizer step on a committed step's rows) and `sync`
(push the new weights into the rollout engine).

The update reads its rows back from the committed part, so the same code replays a step
on resume. The Runtime's policy version says which updates are applied; an update whose
step is already applied returns at once (a retried task never applies it twice).
"""

from __future__ import annotations

from dataclasses import asdict

from prefect import task

from rlpipe.core.failpoints import failpoint
from rlpipe.core.seeds import derive_seed
from rlpipe.rl.samples import train_samples
from rlpipe.tasks.runtime import Runtime, get_runtime
from rlpipe.tasks.stage_options import STAGE_OPTIONS


def apply_committed_update(runtime: Runtime, step: int) -> dict[str, float]:
    """Apply the policy update of committed step `step` (policy version step-1 -> step)."""
    if runtime.policy_version >= step:
        return {}
    if runtime.policy_version != step - 1:
        raise RuntimeError(f"update of step {step} needs policy version {step - 1}, have {runtime.policy_version}")
    manifest = runtime.lake.read_manifest(runtime.run_id, step)
    if manifest is None:
        raise RuntimeError(f"step {step} of run {runtime.run_id} is not committed; nothing to update from")
    rows = runtime.lake.read_parts(manifest.parts)
    shuffle_seed = derive_seed(runtime.config.seed, step, "mini-batches")  # replay shuffles the same
    metrics = runtime.trainer.update(train_samples(rows), shuffle_seed=shuffle_seed)
    failpoint("update")
    runtime.policy_version = step
    return {f"train/{name}": float(value) for name, value in asdict(metrics).items()}


@task(name="update", **STAGE_OPTIONS)
def update(run_id: str, step: int) -> dict[str, float]:
    return apply_committed_update(get_runtime(run_id), step)


@task(name="sync", **STAGE_OPTIONS)
def sync(run_id: str, step: int) -> int:
    """Load the trainer's weights into the engine; return the engine's policy version."""
    runtime = get_runtime(run_id)
    if runtime.engine.policy_version != runtime.policy_version:
        runtime.engine.load_weights(runtime.trainer.named_weights(), runtime.policy_version)
    return runtime.engine.policy_version
