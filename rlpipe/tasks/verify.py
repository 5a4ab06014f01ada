"""Stage task `verify`: score every staged completion, fanned out inside this one task.

Exact-answer domains are checked inline; domains that run code borrow a sandbox from the
run's pool per completion, on a thread pool as wide as the sandbox pool. A Prefect task
per completion would drown the server, so there is none.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

from prefect import task

from rlpipe.core.failpoints import failpoint
from rlpipe.core.records import Trajectory
from rlpipe.tasks.policy import STAGE_OPTIONS, stage_cache_key
from rlpipe.tasks.runtime import Runtime, get_runtime


def _verify_one(runtime: Runtime, row: Trajectory) -> Trajectory:
    env = runtime.mixture.env_for(row.task)
    if not env.needs_sandbox:
        verdict = env.verify(row.task, row.completion.text)
    else:
        with runtime.sandbox_pool.acquire() as sandbox:
            verdict = env.verify(row.task, row.completion.text, sandbox)
    return dataclasses.replace(row, verdict=verdict)


@task(name="verify", cache_key_fn=stage_cache_key, **STAGE_OPTIONS)
def verify(run_id: str, step: int, staged_uri: str) -> str:
    runtime = get_runtime(run_id)
    rows = runtime.lake.read_staged(staged_uri)
    if runtime.sandbox_pool is None:
        verified = [_verify_one(runtime, row) for row in rows]
    else:
        with ThreadPoolExecutor(max_workers=runtime.sandbox_pool.size) as executor:
            verified = list(executor.map(lambda row: _verify_one(runtime, row), rows))
    failpoint("verify")
    return runtime.lake.write_staged(run_id, step, "verify", verified)
