"""Retry and cache policy shared by every stage task.

- Retries: only `InfraError` (storage unreachable, sandbox daemon gone, engine died) is
  retried, 6 times, with exponential backoff and jitter. Bad data or config fails at once.
  The first delay is $RLPIPE_RETRY_BACKOFF_S (default 1 s: 1, 2, 4, 8, 16, 32 s, enough to
  outlast a minute's outage), read once at import; the tests set it small so that a retried
  stage does not cost them a minute. Not a user setting: it is not part of the run config.
- Task run names say the step ("generate-step-4"): a run's stages are tasks of its one flow
  run, so the Prefect UI and API tell steps apart by name. No tags: Prefect asks its API
  for the concurrency limits of a task run's tags on every call (a round trip per stage).
- Cache keys: (run id, run incarnation, step and round, stage, config hash, the policy
  version that generates the step), never
  the Prefect run id, so a UI retry of a crashed flow run and a new flow run started with
  --resume both skip a stage that already finished. What a cached stage returns is a
  reference into the lake, and the lake stays the truth: a step whose manifest exists is
  skipped before any of its stages is called.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from rlpipe.core.errors import ConfigError, InfraError

BACKOFF_ENV_VAR = "RLPIPE_RETRY_BACKOFF_S"
DEFAULT_BACKOFF_S = 1.0


def first_retry_delay_s(environ: Mapping[str, str] = os.environ) -> float:
    """The first retry delay: $RLPIPE_RETRY_BACKOFF_S if set (seconds, > 0), else 1 s."""
    raw = environ.get(BACKOFF_ENV_VAR, "").strip()
    if not raw:
        return DEFAULT_BACKOFF_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(
            f"{BACKOFF_ENV_VAR}={raw!r} is not a positive number of seconds",
            hint=f"unset {BACKOFF_ENV_VAR} (default {DEFAULT_BACKOFF_S:g} s) or set it to e.g. 0.1",
        )
    return value


STAGE_RETRIES = 6
STAGE_RETRY_BACKOFF_S = first_retry_delay_s()
STAGE_RETRY_DELAYS = exponential_backoff(backoff_factor=STAGE_RETRY_BACKOFF_S)  # 1, 2, 4, 8, 16, 32 s by default
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

    from rlpipe.rl.staleness import generation_version

    runtime = get_runtime(parameters["run_id"])
    step, round_ = parameters["step"], parameters.get("round_", 0)
    return "/".join(
        [
            parameters["run_id"],
            runtime.incarnation,
            f"step={step}" if round_ == 0 else f"step={step}/round={round_}",
            f"stage={context.task.name}",
            runtime.config.config_hash(),
            f"policy={generation_version(step, runtime.config.rollout.max_staleness)}",
        ]
    )


STAGE_OPTIONS: dict[str, Any] = dict(
    retries=STAGE_RETRIES,
    retry_delay_seconds=STAGE_RETRY_DELAYS,
    retry_jitter_factor=STAGE_RETRY_JITTER,
    retry_condition_fn=retry_infra_errors_only,
)
"""Retries, for the stages with a cache key of their own (`cache_key_fn=stage_cache_key`)."""

UNCACHED_STAGE_OPTIONS: dict[str, Any] = dict(STAGE_OPTIONS, cache_policy=NO_CACHE, persist_result=False)
"""Retries, and no cache: the stages that are never skipped. Prefect's default policy would
hash every call's inputs and the task's source for a cache no result is ever stored for,
and a persisted result of a stage that is never skipped is never read (not persisting it
halved the cost of a task call: about 19 -> 8 ms on this 2-core machine)."""
