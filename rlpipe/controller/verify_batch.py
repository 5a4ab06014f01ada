"""Verify a batch of (task, completion text) pairs with their domains' verifiers: exact
domains inline, domains that run code on a sandbox pool (`pool.map`: one pre-warmed sandbox
per completion, as many at once as the pool holds, verdicts back in input order).

Plain functions without Prefect, so the verify stage (controller/verify.py), `rlpipe rescore`
(controller/rescore.py) and the quality gate before training (controller/quality_gate.py) share one
fan-out. When every sandboxed verification of a batch failed with sandbox_error, the backend
itself is down (docker daemon gone, bwrap broken): that raises SandboxUnavailable, an
InfraError, instead of handing back a batch without rewards.

What it does not: build the pool or the envs (controller/launch.py, controller/sample.py), or store verdicts.
"""

from __future__ import annotations

from collections.abc import Callable

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.core.records import Task, Verdict, VerdictReason
from rlpipe.envs.base import Env
from rlpipe.envs.mixture import Mixture

VerifyOne = Callable[[Env, Task, str, object], Verdict]


def _env_verify(env: Env, task: Task, text: str, sandbox: object) -> Verdict:
    return env.verify(task, text, sandbox)  # type: ignore[arg-type]


def verify_batch(mixture: Mixture, sandbox_pool: object | None, pairs: list[tuple[Task, str]],
                 verify_one: VerifyOne = _env_verify) -> list[Verdict]:
    """A verdict per (task, completion text), in order; `verify_one(env, task, text, sandbox)`
    judges one (default: the env's own verify)."""
    verdicts: list[Verdict | None] = [None] * len(pairs)
    sandboxed: list[int] = []
    for index, (task_, text) in enumerate(pairs):
        env = mixture.env_for(task_)
        if env.needs_sandbox:
            sandboxed.append(index)
        else:
            verdicts[index] = verify_one(env, task_, text, None)
    if sandboxed:
        if sandbox_pool is None:
            raise RuntimeError("a domain needs a sandbox but the runtime has no sandbox pool (build_sandbox_pool)")

        def one(sandbox, index: int) -> Verdict:
            task_, text = pairs[index]
            return verify_one(mixture.env_for(task_), task_, text, sandbox)

        results = sandbox_pool.map(one, sandboxed)  # type: ignore[attr-defined]
        if all(verdict.reason is VerdictReason.SANDBOX_ERROR for verdict in results):
            raise SandboxUnavailable(f"all {len(results)} sandboxed verifications failed; the first: {results[0].detail}",
                                     hint="run `rlpipe sandbox selftest --backend B` to see what the backend lacks")
        for index, verdict in zip(sandboxed, results):
            verdicts[index] = verdict
    return verdicts  # type: ignore[return-value] - every slot is filled above
