"""Stage `verify` (stage 3 of a step, tasks/step_tasks.py): score every generated
completion, fanned out inside that one task.

Exact-answer domains are checked inline. Domains that run code go through the run's
sandbox pool with `pool.map`: one pre-warmed sandbox per completion, as many at once as the
pool holds, each sandbox reset before its next use, verdicts back in row order
(controller/verify_batch.py, shared with `rlpipe rescore` and the quality gate). A Prefect
task per completion would drown the server, so there is none. `verify_all` is the same
fan-out for any list of (task, completion text) pairs (the held-out evaluation uses it).

The rows go to the next stage in memory; the step stages them in the lake (tasks/step_tasks.py)
when some row was verified in a sandbox (`runs_in_sandboxes`). Rows checked inline only
are not staged: an exact-answer check of a step's rows costs microseconds a row, staging
them (an Arrow table, its file, two writes) more than that, and a retry verifies
them again to the same verdicts.
Rows that arrive with a verdict are kept as they are: a multi-turn episode (agent_tasks) is
judged by its verifier in its own sandbox at the end of the episode, in the generate stage
(controller/agent_episodes.py), since the final state lives only there.

A sandbox that fails one verification gives that row a sandbox_error verdict (reward None,
left out of advantages and means). When every sandboxed row of the batch failed so, the
backend itself is down (docker daemon gone, bwrap broken): that raises SandboxUnavailable,
an InfraError, so Prefect retries the step's task (whose generated rows are staged: they
are not generated again) instead of committing a step with no rewards.
"""

from __future__ import annotations

import dataclasses

from rlpipe.controller.runtime import Runtime
from rlpipe.controller.verify_batch import verify_batch
from rlpipe.core.failpoints import failpoint
from rlpipe.core.records import Task, Trajectory, Verdict


def verify_all(runtime: Runtime, pairs: list[tuple[Task, str]]) -> list[Verdict]:
    """A verdict per (task, completion text), in order; sandboxed ones on the run's pool."""
    return verify_batch(runtime.mixture, runtime.workers.sandbox_pool, pairs)


def runs_in_sandboxes(runtime: Runtime, rows: list[Trajectory]) -> bool:
    """Whether verifying `rows` runs some row in a sandbox (rows with a verdict are kept)."""
    return any(row.verdict is None and runtime.mixture.env_for(row.task).needs_sandbox for row in rows)


def verify_rows(runtime: Runtime, rows: list[Trajectory]) -> list[Trajectory]:
    """The rows with their verdicts (episodes come judged from generate: kept)."""
    todo = [index for index, row in enumerate(rows) if row.verdict is None]
    verdicts = verify_all(runtime, [(rows[index].task, rows[index].completion.text) for index in todo])
    verified = list(rows)
    for index, verdict in zip(todo, verdicts):
        verified[index] = dataclasses.replace(rows[index], verdict=verdict)
    failpoint("verify")
    return verified
