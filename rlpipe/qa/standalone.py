"""The quality gate of one environment outside a training run: what `rlpipe qa ENV` and the
`rl-qa` flow both run.

Builds the env (a registered domain, or one a config's envs.reasoning_gym / envs.files
tables define), a sandbox pool of the chosen backend when the env needs one (sized by
cores and memory, at most 4, unless `workers` says), and runs the gate (qa/gate.py) on it.

Not here: printing, report files, MLflow or Prefect artifacts (the callers), the gate run
before a training run's warm start (tasks/quality_gate.py).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from rlpipe.core.records import Task, Verdict
from rlpipe.envs.mixture import build_env
from rlpipe.qa.gate import PolicyOptions, VerifyOne, guarded_verify, run_gate
from rlpipe.qa.records import QaReport
from rlpipe.sandbox.backends import reap_leaked, sandbox_constructor
from rlpipe.sandbox.base import Limits

MAX_DEFAULT_SANDBOXES = 4


@dataclass(frozen=True)
class GateRequest:
    """One env to gate and how (the options of `rlpipe qa`)."""

    env: str
    samples: int = 10
    repeats: int = 3
    seed: int = 0
    backend: str = "bwrap"
    config_path: Path | None = None
    timeout_s: float | None = None
    workers: int | None = None
    policy: PolicyOptions | None = None


def build_env_for_gate(env_name: str, config_path: Path | None, timeout_s: float | None) -> tuple[object, str | None]:
    """(the env, the config's model.prompt_format or None)."""
    params: dict[str, object] = {}
    prompt_format = None
    if config_path is not None:
        from rlpipe.core.config import load_config

        run_config = load_config(config_path, [])
        params = dict(max_operand=run_config.envs.max_operand, max_word_len=run_config.envs.max_word_len,
                      agent_families=run_config.envs.agent_families,
                      timeout_s=run_config.sandbox.timeout_s, **run_config.envs.domain_tables())
        prompt_format = run_config.model.prompt_format
    if timeout_s is not None:
        params["timeout_s"] = timeout_s
    return build_env(env_name, **params), prompt_format


def gate_env(request: GateRequest, environment: object | None = None, verify_one: VerifyOne = guarded_verify) -> QaReport:
    """Run the gate on `request.env` (or on `environment`, already built from it), judging
    each answer with `verify_one(env, task, text, sandbox)` (a multi-turn env's answers are
    scripted episodes: the caller gives controller/agent_episodes.py's `gate_verify`)."""
    if environment is None:
        environment, _ = build_env_for_gate(request.env, request.config_path, request.timeout_s)
    with ExitStack() as stack:
        if getattr(environment, "needs_sandbox", False):
            from rlpipe.sandbox.pool import SandboxPool, default_pool_size

            limits = Limits(timeout_s=float(getattr(environment, "timeout_s", 10.0)))
            make = sandbox_constructor(request.backend)
            size = request.workers or min(MAX_DEFAULT_SANDBOXES, default_pool_size(limits.memory_mb))
            pool = stack.enter_context(SandboxPool(lambda: make(limits), size, memory_mb_per_sandbox=limits.memory_mb,
                                                   reap_leaked=lambda: reap_leaked(request.backend)))

            def verify_many(pairs: list[tuple[Task, str]]) -> list[Verdict]:
                return pool.map(lambda sandbox, pair: verify_one(environment, pair[0], pair[1], sandbox), pairs)
        else:
            def verify_many(pairs: list[tuple[Task, str]]) -> list[Verdict]:
                return [verify_one(environment, task, text, None) for task, text in pairs]

        return run_gate(environment, verify_many, samples=request.samples, seed=request.seed, repeats=request.repeats,
                        policy=request.policy)
