"""Stage tasks `sample` and `generate`: pick the step's tasks, sample completions.

The engine is third-party machinery: a RuntimeError from it (what torch raises for a device
fault, CUDA OOM included) or an OSError/EOFError (an engine process or connection that died)
becomes EngineFailed, an InfraError, so Prefect retries the stage. A deterministic bug that
raises RuntimeError is therefore retried too, but only as often as any stage (STAGE_RETRIES),
then the run fails with it. Other errors (ValueError on bad parameters, ...) fail at once.
"""

from __future__ import annotations

from prefect import task

from rlpipe.core.errors import EngineFailed
from rlpipe.core.failpoints import failpoint
from rlpipe.core.records import Trajectory
from rlpipe.core.seeds import derive_seed
from rlpipe.engines.base import SamplingParams
from rlpipe.tasks.runtime import get_runtime, step_tasks
from rlpipe.tasks.stage_options import STAGE_OPTIONS, stage_cache_key


@task(name="sample", **STAGE_OPTIONS)
def sample(run_id: str, step: int) -> tuple[str, ...]:
    """The task ids of this step, drawn by domain ratio with a seed of (run seed, step)."""
    return tuple(task.task_id for task in step_tasks(get_runtime(run_id), step))


@task(name="generate", cache_key_fn=stage_cache_key, **STAGE_OPTIONS)
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
    try:
        completions = runtime.engine.generate([(t.task_id, t.prompt) for t in tasks], params)
    except (RuntimeError, OSError, EOFError) as exc:
        raise EngineFailed(
            f"step {step}: the rollout engine failed: {type(exc).__name__}: {exc}",
            hint="the stage is retried; if it keeps failing, check the engine's device and memory",
        ) from exc
    failpoint("generate")
    by_id = {t.task_id: t for t in tasks}
    rows = [
        Trajectory(run_id, step, runtime.policy_version, by_id[c.task_id], c)
        for c in completions
    ]
    return runtime.lake.write_staged(run_id, step, "generate", rows)
