"""Typed records that cross module boundaries: Task, Completion, Verdict, Trajectory.

Frozen dataclasses only; no I/O here. The Parquet schema that stores a Trajectory as one
row lives in storage/schema.py and carries `schema_version` (SCHEMA_VERSION below).
`None` always means absent (a reward of None = could not be scored, excluded from
advantages; 0.0 = wrong).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

SCHEMA_VERSION = 2
"""2: `Completion.logprobs` are those of the sampling distribution (temperature, top-p),
and committed parts keep run_id and step in their hive path only (storage/schema.py);
1 stored temperature-1 logprobs (see engines/base.py). A run with rows older than this
version is not resumed (tasks/lifecycle.py)."""


class VerdictReason(str, Enum):
    """Why a completion got its reward."""

    OK = "ok"
    WRONG = "wrong"
    FORMAT = "format"
    TIMEOUT = "timeout"
    OOM = "oom"
    CRASH = "crash"
    SANDBOX_ERROR = "sandbox_error"


@dataclass(frozen=True)
class VerifierSpec:
    """How to check an answer: `kind` names the verifier, `payload` is its input
    (an expected answer, unit-test source, a final-state check script)."""

    kind: str
    payload: str


Segments = tuple[tuple[str, bool], ...]
"""A whole multi-turn episode after its prompt, for the supervised warm-start: (text,
trained) in order, the replies trained, the tool output between them context only."""


@dataclass(frozen=True)
class Task:
    """One prompt of one domain, with what is needed to verify an answer to it.

    `reference_answer` is the oracle solution when the env has one (used for the
    supervised warm-start and for environment QA), else None.
    """

    task_id: str
    domain: str
    prompt: str
    verifier: VerifierSpec
    reference_answer: str | None = None
    metadata: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Completion:
    """One sampled answer to a task, with what the trainer needs to replay the update."""

    task_id: str
    sample_idx: int
    text: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str  # "stop" (stop string or EOS) or "length"
    policy_version: int
    loss_mask: tuple[int, ...] | None = None
    """Multi-turn episodes (agents/episodes.py): 1 on each of `token_ids` the policy sampled,
    0 on tokens it did not (tool outputs, observations), whose `logprobs` are 0.0 and which
    never enter the loss. None: every token was sampled (single-turn completions; rows
    stored before this field existed read back as None)."""


@dataclass(frozen=True)
class Verdict:
    """The verifier's judgement of one completion."""

    reward: float | None
    passed: bool
    reason: VerdictReason
    detail: str = ""
    duration_s: float = 0.0
    verifier_version: str = ""


@dataclass(frozen=True)
class Trajectory:
    """One row of the lake: a task, one completion, its verdict and its advantage.

    Rows committed in a step always carry a verdict; staged rows between stages may not.
    """

    run_id: str
    step: int
    policy_version: int
    task: Task
    completion: Completion
    verdict: Verdict | None = None  # None until the verify stage has run
    advantage: float | None = None  # None until computed, or when the reward is None
    schema_version: int = field(default=SCHEMA_VERSION)
