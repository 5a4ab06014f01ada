"""Records of agent trials: the verdict taxonomy, one step of an episode, one trial.

Verdicts keep three families apart (TrialVerdict.family):

- agent: the agent's own result. `passed`; `failed` (it submitted, the tests gave a reward
  below 1); `agent_timeout`, `max_steps`, `malformed_calls` (it never submitted: out of
  time, out of steps, or too many malformed calls in a row) and `agent_error` (the agent
  raised) and `context_exhausted` (a policy agent's next prompt would not fit its context
  window or its episode token budget) when the tests then do not pass; `verifier_timeout` (the tests ran past their
  limit on the agent's final state) and `verifier_error` (the tests wrote no readable reward
  on it): abstention scores zero, whatever the agent's state did to the tests.
- infrastructure: what the host caused, never scored as the agent's failure: `sandbox_error`
  (a sandbox could not start or died, or rlpipe itself failed), `engine_error` (the model
  engine failed), `setup_error` (the task's setup script failed, before the agent acted).
- not run: `skipped` (the task needs what the sandbox lacks: a Dockerfile, network, a GPU,
  a command; or the agent cannot attempt it) and `invalid_task` (the folder is malformed).

When an agent that never submitted still leaves a state the tests pass, the verdict is
`passed`: tasks are judged by their final state, and `ending` records how the episode ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class TrialVerdict(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    AGENT_TIMEOUT = "agent_timeout"
    MAX_STEPS = "max_steps"
    MALFORMED_CALLS = "malformed_calls"
    AGENT_ERROR = "agent_error"
    CONTEXT_EXHAUSTED = "context_exhausted"
    VERIFIER_TIMEOUT = "verifier_timeout"
    SANDBOX_ERROR = "sandbox_error"
    ENGINE_ERROR = "engine_error"
    SETUP_ERROR = "setup_error"
    VERIFIER_ERROR = "verifier_error"
    SKIPPED = "skipped"
    INVALID_TASK = "invalid_task"

    @property
    def family(self) -> str:
        """`agent`, `infrastructure` or `not_run`."""
        if self in _INFRASTRUCTURE:
            return "infrastructure"
        if self in (TrialVerdict.SKIPPED, TrialVerdict.INVALID_TASK):
            return "not_run"
        return "agent"


_INFRASTRUCTURE = frozenset({TrialVerdict.SANDBOX_ERROR, TrialVerdict.ENGINE_ERROR, TrialVerdict.SETUP_ERROR})


class Ending(str, Enum):
    """How the agent's episode ended (before the verifier)."""

    SUBMITTED = "submitted"
    AGENT_TIMEOUT = "agent_timeout"
    MAX_STEPS = "max_steps"
    MALFORMED_CALLS = "malformed_calls"
    AGENT_ERROR = "agent_error"
    CONTEXT_EXHAUSTED = "context_exhausted"
    ENGINE_ERROR = "engine_error"
    SANDBOX_ERROR = "sandbox_error"
    NOT_STARTED = "not_started"


@dataclass(frozen=True)
class TrialStep:
    """One turn: the agent's reply, the call parsed from it (or why it is malformed), the result."""

    index: int
    reply: str
    tool: str | None  # None: malformed
    arguments: dict[str, str]
    malformed_kind: str | None
    observation: str
    exit_code: int | None  # bash only
    tool_error: bool  # the call was well formed but the tool failed (missing file, timeout, ...)
    duration_s: float
    started_s: float = 0.0  # seconds after the episode started
    tree_sha256: str | None = None  # /work after the step (agents/tree_state.py); None: not taken


@dataclass(frozen=True)
class TrialResult:
    """One task attempted once by one agent on one backend."""

    task_id: str
    agent: str
    backend: str
    verdict: TrialVerdict
    ending: Ending
    reward: float | None  # None: no reward was read (not run, infrastructure failure)
    detail: str  # why, in a line or a few (skip reason, error, the verifier's output tail)
    steps: tuple[TrialStep, ...] = ()
    agent_duration_s: float = 0.0
    verifier_duration_s: float = 0.0
    duration_s: float = 0.0
    malformed_counts: dict[str, int] = field(default_factory=dict)
    started_at_ms: int = 0  # unix time the trial started (0: unknown)
    replay_of: str | None = None  # a replay: the source trial id, whose first replay_from_step steps were re-executed
    replay_from_step: int | None = None

    @property
    def passed(self) -> bool:
        return self.verdict is TrialVerdict.PASSED
