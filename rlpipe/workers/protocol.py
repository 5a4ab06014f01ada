"""What crosses between the controller and a worker: typed requests, typed replies, the
handle that names a worker, and how an error raised in a worker is raised again in the
controller.

Requests are frozen dataclasses, one per remote call; a worker answers each with `Ok(value)`
or `Failed(...)`. Everything is pickled by `multiprocessing.connection`, which only talks to a
peer that proved it holds the run's authkey (HMAC challenge), so no other local user can
send a pickle to a worker.

Errors: an rlpipe error (a ConfigError, StorageUnavailable, LakeCorrupted, ...) raised in a
worker is raised again in the controller as the same class, message and hint, so Prefect's
retry policy sees what it would have seen in one process. A RuntimeError, OSError or
MemoryError (what torch raises for a device fault or an OOM) becomes EngineFailed (an
InfraError: retried). Anything else becomes RemoteError (a bug: not retried), carrying
the worker's traceback text.

Not here: sockets or processes (client.py, server.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlpipe.core import errors as rlpipe_errors
from rlpipe.core.errors import EngineFailed, RlpipeError

WorkerKind = Literal["engine", "trainer"]


@dataclass(frozen=True)
class WorkerHandle:
    """How the controller names a live worker: run id, kind, socket address, pid."""

    run_id: str
    kind: WorkerKind
    address: str
    pid: int


# ---- requests every worker serves -------------------------------------------------------


@dataclass(frozen=True)
class Ping:
    """Answers the worker's pid once it is ready (its model is built)."""


@dataclass(frozen=True)
class Stop:
    """Reply, then exit."""


@dataclass(frozen=True)
class WeightsDigest:
    """sha256 over the names, dtypes, shapes and bytes of the worker's weights (tests: a sync
    gives the engine the trainer's exact weights)."""


# ---- engine worker ----------------------------------------------------------------------


@dataclass(frozen=True)
class Generate:
    """`params.n` completions per (task_id, prompt) pair; reply: GenerateResult. `dtype` and
    `batch_size` (hf engine; None = the engine's own): this request alone runs at that batch
    size, in that weights dtype on a copy of the engine's weights made for it and freed after
    it (a greedy evaluation, eval.engine_dtype / eval.batch_size)."""

    prompts: tuple[tuple[str, str], ...]
    params: Any  # engines.base.SamplingParams (typed as Any to keep this module torch-free)
    dtype: str | None = None
    batch_size: int | None = None


@dataclass(frozen=True)
class GenerateResult:
    completions: list  # list[core.records.Completion], each with the engine's policy_version
    policy_version: int


@dataclass(frozen=True)
class LoadWeightsFile:
    """Load a safetensors file written by the trainer; reply: the acknowledged version."""

    path: str
    policy_version: int


@dataclass(frozen=True)
class BeginWeightLoad:
    """A weight stream begins (workers/weight_stream.py): until EndWeightLoad the engine's
    weights are mixed, so it refuses to generate, and a failure makes the worker exit.
    `rows`: (name, rows) of every weight the stream will fill."""

    stream_id: str
    policy_version: int
    rows: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class LoadWeightChunk:
    """Copy one chunk file of the stream into the engine's weights in place, delete the file."""

    stream_id: str
    path: str


@dataclass(frozen=True)
class EndWeightLoad:
    """Every row of every weight arrived: serve the stream's version; reply: that version."""

    stream_id: str


@dataclass(frozen=True)
class EngineVersion:
    """Reply: the policy version the engine serves."""


@dataclass(frozen=True)
class RenderChat:
    """A conversation ((role, content), ...) through the engine's tokenizer's chat template,
    the assistant turn opened (engines/sampling.render_chat); reply: RenderedChat. A policy
    agent renders each turn's prompt so, then sends the text to Generate (prompt_format plain)."""

    messages: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RenderedChat:
    text: str
    token_count: int  # ids the engine feeds for `text` as a plain prompt


# ---- trainer worker ---------------------------------------------------------------------


@dataclass(frozen=True)
class WarmStartBegin:
    """Start the supervised warm-start in the worker (a thread): `examples` are (prompt,
    reference answer) pairs, or (prompt, segments) for whole episodes (rl/warmstart.py). It
    pauses at each accuracy check until WarmStartContinue."""

    examples: tuple[tuple[str, Any], ...]
    steps: int
    batch_size: int
    lr: float
    seed: int
    check_every: int
    with_checks: bool
    keep_optimizer: bool = False  # step the RL trainer's AdamW; zero its momentum at the end


@dataclass(frozen=True)
class WarmStartWait:
    """Wait at most `timeout_s` for the warm-start to reach a check or its end; reply:
    WarmStartState (the step losses since the last reply included)."""

    timeout_s: float = 1.0


@dataclass(frozen=True)
class WarmStartContinue:
    """Answer the pending check: stop (target reached) or go on."""

    stop: bool


@dataclass(frozen=True)
class WarmStartState:
    state: Literal["running", "check", "done"]
    losses: tuple[tuple[int, float], ...]  # (step, loss) since the last reply
    check_step: int | None = None  # the step the check is at (state "check")


@dataclass(frozen=True)
class Update:
    """The update of committed step `step` (policy version step-1 -> step), on the rows of
    `parts` (PartRefs of its manifest) read from the lake by the worker; `shuffle_seed` from
    the run seed and step. Reply: UpdateResult; an update already applied is skipped."""

    step: int
    parts: tuple  # tuple[storage.lake_records.PartRef, ...]
    shuffle_seed: int


@dataclass(frozen=True)
class UpdateResult:
    policy_version: int
    metrics: dict[str, float] = field(default_factory=dict)  # {} when the update was already applied


@dataclass(frozen=True)
class SaveCheckpoint:
    """Write checkpoint `step` (policy/ + trainer/) into the lake."""

    step: int
    config_hash: str


@dataclass(frozen=True)
class Restore:
    """Bring the trainer to `target_version` (None: the last committed step) from the lake:
    the newest intact checkpoint at or before it, then replay of the committed steps after
    it. Reply: RestoreResult."""

    target_version: int | None
    seed: int


@dataclass(frozen=True)
class RestoreResult:
    last_committed: int  # -1: no checkpoint at all (the run warm-starts again)
    policy_version: int
    checkpoint_step: int | None
    replayed: dict[int, dict[str, float]]  # step -> train metrics of the replayed update
    fallbacks: tuple[str, ...]  # one line per corrupted checkpoint skipped


@dataclass(frozen=True)
class ResetReference:
    """Make the KL reference a copy of the current policy (after the warm-start)."""


@dataclass(frozen=True)
class PublishWeights:
    """Write the weights (named_parameters, or the LoRA adapter's) as one safetensors file in
    `folder`; reply: Published."""

    folder: str


@dataclass(frozen=True)
class BeginWeightStream:
    """Plan a stream of the current weights in chunks of at most `chunk_bytes`; reply:
    WeightStreamPlan. The plan holds while the weights do not change (an update, a restore or
    a warm-start step ends it)."""

    chunk_bytes: int


@dataclass(frozen=True)
class WeightStreamPlan:
    stream_id: str
    policy_version: int
    chunks: int
    rows: tuple[tuple[str, int], ...]  # (name, rows) of every weight streamed
    bytes: int


@dataclass(frozen=True)
class PublishWeightChunk:
    """Write chunk `index` of stream `stream_id` as a file in `folder`; reply: WeightChunk.
    Fails (RuntimeError) if the weights changed since the stream began."""

    stream_id: str
    index: int
    folder: str


@dataclass(frozen=True)
class WeightChunk:
    path: str
    bytes: int


@dataclass(frozen=True)
class Published:
    path: str
    policy_version: int
    bytes: int


# ---- the trainer worker and the ranks of its torchrun group (trainer_group.py) ----


@dataclass(frozen=True)
class RankHello:
    rank: int
    pid: int


@dataclass(frozen=True)
class RankCall:
    """One request for this rank; `sync_first`: copy rank 0's weights and optimizer state to
    every rank before it (rank 0 alone changed them since the last collective call)."""

    request: Any
    sync_first: bool = False


@dataclass(frozen=True)
class RankReply:
    reply: Any  # protocol.Ok | protocol.Failed
    poisoned: bool  # the rank's state changed half-way: the group must be rebuilt from the lake


# ---- replies ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Accepted:
    """Sent by the worker as soon as it has read a request, before it acts on it. A call
    whose connection breaks before this arrives was never acted on: the client may send it
    again to a fresh worker (a worker killed between two calls)."""


@dataclass(frozen=True)
class Ok:
    value: Any = None


@dataclass(frozen=True)
class Failed:
    error_type: str  # the class name
    message: str
    hint: str
    is_rlpipe: bool
    infra: bool  # RuntimeError / OSError / MemoryError: a machinery fault
    traceback: str


class RemoteError(Exception):
    """A worker raised an error that is neither rlpipe's own nor a machinery fault (a bug):
    not retried. The message names the worker, the error and its traceback."""


INFRA_ERRORS = (RuntimeError, OSError, MemoryError, EOFError)


def failed_from(error: BaseException, traceback_text: str) -> Failed:
    """The reply that carries `error` to the controller."""
    if isinstance(error, RlpipeError):
        return Failed(type(error).__name__, error.message, error.hint, True, False, traceback_text)
    return Failed(type(error).__name__, str(error), "", False, isinstance(error, INFRA_ERRORS), traceback_text)


def raise_failed(failed: Failed, kind: str, call: str) -> None:
    """Raise in the controller what the worker raised (see the module docstring)."""
    if failed.is_rlpipe:
        error_class = getattr(rlpipe_errors, failed.error_type, None)
        if isinstance(error_class, type) and issubclass(error_class, RlpipeError):
            raise error_class(failed.message, failed.hint)
    if failed.infra:
        raise EngineFailed(
            f"the {kind} worker failed in {call}: {failed.error_type}: {failed.message}",
            hint="the stage is retried; if it keeps failing, check the worker's device and memory",
        )
    raise RemoteError(f"the {kind} worker raised {failed.error_type} in {call}: {failed.message}\n"
                      f"worker traceback:\n{failed.traceback}")
