"""Stage tasks `sample` and `generate`: pick the step's tasks, sample completions in the
engine worker.

The engine lives in its own process (rlpipe/workers/): an engine that died or failed on its
device raises EngineFailed (an InfraError) from the worker client, so Prefect retries the
stage, and the retry starts a fresh engine worker synced to the trainer's weights. Every row
records the policy version the engine acknowledged, which must be the run's current one.
"""

from __future__ import annotations

from prefect import task

from rlpipe.core.failpoints import failpoint
from rlpipe.core.records import Trajectory
from rlpipe.core.seeds import derive_seed
from rlpipe.engines.sampling import SamplingParams
from rlpipe.tasks.runtime import get_runtime, step_tasks, sync_weights
from rlpipe.tasks.stage_options import STAGE_OPTIONS, UNCACHED_STAGE_OPTIONS, stage_cache_key


@task(name="sample", task_run_name="sample-step-{step}", **UNCACHED_STAGE_OPTIONS)
def sample(run_id: str, step: int) -> tuple[str, ...]:
    """The task ids of this step, drawn by domain ratio with a seed of (run seed, step)."""
    return tuple(task.task_id for task in step_tasks(get_runtime(run_id), step))


@task(name="generate", task_run_name="generate-step-{step}", cache_key_fn=stage_cache_key, **STAGE_OPTIONS)
def generate(run_id: str, step: int, task_ids: tuple[str, ...]) -> str:
    """Sample group_size completions per task; stage them in the lake; return their URI."""
    runtime = get_runtime(run_id)
    rollout = runtime.config.rollout
    tasks = step_tasks(runtime, step)
    if tuple(t.task_id for t in tasks) != task_ids:
        raise RuntimeError(f"step {step}: sampled tasks differ from {task_ids}; sampling must be a function of (seed, step)")
    params = SamplingParams(
        n=rollout.group_size,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        max_new_tokens=rollout.max_new_tokens,
        stop=rollout.stop,
        seed=derive_seed(runtime.config.seed, step, "generate"),
    )
    if runtime.engine_version != runtime.policy_version:
        sync_weights(runtime)
    result = runtime.engine.generate([(t.task_id, t.prompt) for t in tasks], params)
    if result.policy_version != runtime.policy_version:
        raise ValueError(f"step {step}: the engine sampled with policy version {result.policy_version}, "
                         f"the run is at {runtime.policy_version}")
    failpoint("generate")
    by_id = {t.task_id: t for t in tasks}
    rows = [
        Trajectory(run_id, step, completion.policy_version, by_id[completion.task_id], completion)
        for completion in result.completions
    ]
    return runtime.lake.write_staged(run_id, step, "generate", rows)
