"""Retry and cache policy shared by every stage task.

- Retries: only `InfraError` (storage unreachable, sandbox daemon gone, engine died) is
  retried, with exponential backoff and jitter. Bad data or config fails at once.
- Cache keys: (run id, run incarnation, step, stage, config hash, policy version), never
  the Prefect run id, so a UI retry of a crashed flow run and a new flow run started with
  --resume both skip a stage that already finished. What a cached stage returns is a
  reference into the lake, and the lake stays the truth: a step whose manifest exists is
  skipped before any of its stages is called.
"""

from __future__ import annotations

from typing import Any

from prefect.tasks import exponential_backoff

from rlpipe.core.errors import InfraError

STAGE_RETRIES = 6
STAGE_RETRY_DELAYS = exponential_backoff(backoff_factor=1)  # 1, 2, 4, 8, 16, 32 s: outlasts a minute's outage
STAGE_RETRY_JITTER = 0.5


def retry_infra_errors_only(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect retry_condition_fn: retry iff the stage raised an InfraError."""
    try:
        state.result()
    except InfraError:
        return True
    except Exception:  # noqa: BLE001 - anything else is the user's data or a bug
        return False
    return False


def stage_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    """Cache key of a stage call from its reference arguments, never from Prefect ids."""
    from rlpipe.tasks.runtime import get_runtime

    runtime = get_runtime(parameters["run_id"])
    return "/".join(
        [
            parameters["run_id"],
            runtime.incarnation,
            f"step={parameters['step']}",
            f"stage={context.task.name}",
            runtime.config.config_hash(),
            f"policy={runtime.policy_version}",
        ]
    )


STAGE_OPTIONS: dict[str, Any] = dict(
    retries=STAGE_RETRIES,
    retry_delay_seconds=STAGE_RETRY_DELAYS,
    retry_jitter_factor=STAGE_RETRY_JITTER,
    retry_condition_fn=retry_infra_errors_only,
)
