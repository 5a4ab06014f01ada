"""Retry and cache policy shared by every stage task, and the rows a retried stage takes back.

- Retries: only `InfraError` (storage unreachable, sandbox daemon gone, engine died) is
  retried, 6 times, with exponential backoff and jitter. Bad data or config fails at once.
  The first delay is $RLPIPE_RETRY_BACKOFF_S (default 1 s: 1, 2, 4, 8, 16, 32 s, enough to
  outlast a minute's outage), read once at import; the tests set it small so that a retried
  stage does not cost them a minute. Not a user setting: it is not part of the run config.
- Task run names say the step ("step-4", "rollout-step-4"): a run's steps are task runs of
  its one flow run, so the Prefect UI and API tell steps apart by name. No tags: Prefect asks its API
  for the concurrency limits of a task run's tags on every call (a round trip per stage).
- Stage keys (`stage_key`): (run id, run incarnation, step and round, stage, config hash,
  the policy version that generates the step), never the Prefect run id. The rollout stages
  stage what `generate` computed in the lake under this key (`staged_rows`), and what `verify`
  computed when some row was verified in a sandbox (inline exact-answer checks cost less to
  run again than their rows cost to stage),
  so a retry of the task, a UI retry of a crashed flow run and a new flow run started with
  --resume all take them from there instead of computing them again. Prefect's own cache is not used: it
  caches per task run, and a task run per stage costs more than a small step can spare
  (docs/ARCHITECTURE.md, "What orchestration costs"). A step whose manifest exists is
  skipped before any of its stages runs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from rlpipe.core.errors import ConfigError, InfraError
from rlpipe.core.records import Trajectory
from rlpipe.orchestration.run_log import run_logger

if TYPE_CHECKING:
    from rlpipe.controller.runtime import Runtime

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


def stage_key(runtime: Runtime, step: int, round_: int, stage: str) -> str:
    """What determines the rows a stage of `step` computes in round `round_`."""
    from rlpipe.rl.staleness import generation_version

    return "/".join(
        [
            runtime.run_id,
            runtime.records.incarnation,
            f"step={step}" if round_ == 0 else f"step={step}/round={round_}",
            f"stage={stage}",
            runtime.config.config_hash(),
            f"policy={generation_version(step, runtime.config.rollout.max_staleness)}",
        ]
    )


def staged_rows(runtime: Runtime, step: int, round_: int, stage: str, compute: Callable[[], list[Trajectory]]) -> list[Trajectory]:
    """The rows an earlier attempt staged for this stage, else `compute()`'s, staged now."""
    records = runtime.records
    name, key = staged_name(stage, round_), stage_key(runtime, step, round_, stage)
    rows = records.lake.read_staged(runtime.run_id, step, name, key)
    if rows is not None:
        run_logger().warning("step %d: %s's rows were staged by an earlier attempt; taken from the lake, not computed again",
                          step, name)
        return rows
    rows = compute()
    records.lake.write_staged(runtime.run_id, step, name, key, rows)
    return rows


def staged_name(stage: str, round_: int) -> str:
    """The staged-rows name of a stage's output in a round (round 0 keeps the plain name)."""
    return stage if round_ == 0 else f"{stage}-round-{round_}"


STAGE_OPTIONS: dict[str, Any] = dict(
    retries=STAGE_RETRIES,
    retry_delay_seconds=STAGE_RETRY_DELAYS,
    retry_jitter_factor=STAGE_RETRY_JITTER,
    retry_condition_fn=retry_infra_errors_only,
)
"""Retries (for a task that sets its own cache policy)."""

UNCACHED_STAGE_OPTIONS: dict[str, Any] = dict(STAGE_OPTIONS, cache_policy=NO_CACHE, persist_result=False)
"""Retries, and no Prefect cache: every stage. Prefect's default policy would
hash every call's inputs and the task's source for a cache no result is ever stored for,
and a persisted result that is never read back costs a file write (not persisting it
halved the cost of a task call: about 19 -> 8 ms on this 2-core machine)."""
