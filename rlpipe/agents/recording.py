"""Trials to and from the lake: each finished attempt committed at once, and read back on resume.

`EvalRecorder.record` turns a TrialResult into an EvalTrialRow and its EvalStepRows
(rlpipe/storage/evals.py) and commits them (two Parquet parts, then COMMIT.json) before it
returns, so a crash loses at most the trials still in flight. `EvalRecorder.attempts` reads
back every committed attempt as TrialResults, the same records a live trial gives
(`trial_from_rows` inverts `trial_rows`; the malformed counts are recomputed from the steps).

The store is anything with EvalStore's methods (`TrialStore`; rlpipe/storage/evals.py is the
lake's): agents never import the lake itself, whose clients (S3) the layers contract keeps
out of this package. The CLI opens the lake and hands its EvalStore in.

The failpoint `eval-trial-committed` is hit after each commit (crash tests: kill -9 with
some trials committed and others in flight).

What it does not: decide what runs (agents/evaluation.py) or compute metrics (agents/metrics.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from rlpipe.agents.records import Ending, TrialResult, TrialStep, TrialVerdict
from rlpipe.core.failpoints import failpoint
from rlpipe.storage.eval_records import EvalInfo, EvalStepRow, EvalTrialRow, TrialCommit, task_key


class TrialStore(Protocol):
    """Where an eval's records go (storage.evals.EvalStore over a lake)."""

    @property
    def uri(self) -> str: ...

    def write_info(self, info: EvalInfo) -> None: ...

    def read_info(self, eval_id: str) -> EvalInfo | None: ...

    def list_evals(self) -> list[str]: ...

    def commit_trial(self, trial: EvalTrialRow, steps: list[EvalStepRow]) -> TrialCommit: ...

    def commits(self, eval_id: str | None = None) -> list[TrialCommit]: ...

    def read_trial(self, commit: TrialCommit) -> tuple[EvalTrialRow, list[EvalStepRow]]: ...


@dataclass(frozen=True)
class RecordedAttempt:
    """One committed attempt of a task."""

    attempt: int
    session: int
    trial: TrialResult


def trial_rows(eval_id: str, attempt: int, session: int, result: TrialResult,
               instruction: str) -> tuple[EvalTrialRow, list[EvalStepRow]]:
    trial_id = f"{eval_id}/{task_key(result.task_id)}/{attempt}"
    malformed = sum(step.tool is None for step in result.steps)
    trial = EvalTrialRow(
        eval_id=eval_id, trial_id=trial_id, task_id=result.task_id, attempt=attempt, session=session,
        agent=result.agent, backend=result.backend, verdict=result.verdict.value, family=result.verdict.family,
        ending=result.ending.value, reward=result.reward, detail=result.detail, instruction=instruction,
        steps=len(result.steps), tool_calls=len(result.steps) - malformed, malformed_calls=malformed,
        agent_duration_s=result.agent_duration_s, verifier_duration_s=result.verifier_duration_s,
        duration_s=result.duration_s, started_at_ms=result.started_at_ms,
        finished_at_ms=result.started_at_ms + int(result.duration_s * 1000),
        replay_of=result.replay_of, replay_from_step=result.replay_from_step,
    )
    steps = [EvalStepRow(eval_id=eval_id, trial_id=trial_id, task_id=result.task_id, attempt=attempt, step=step.index,
                         reply=step.reply, tool=step.tool, arguments_json=json.dumps(step.arguments, sort_keys=True),
                         malformed_kind=step.malformed_kind, observation=step.observation, exit_code=step.exit_code,
                         tool_error=step.tool_error, started_s=step.started_s, duration_s=step.duration_s,
                         tree_sha256=step.tree_sha256)
             for step in result.steps]
    return trial, steps


def trial_from_rows(trial: EvalTrialRow, steps: list[EvalStepRow]) -> TrialResult:
    records = tuple(TrialStep(index=step.step, reply=step.reply, tool=step.tool, arguments=json.loads(step.arguments_json),
                              malformed_kind=step.malformed_kind, observation=step.observation, exit_code=step.exit_code,
                              tool_error=step.tool_error, duration_s=step.duration_s, started_s=step.started_s,
                              tree_sha256=step.tree_sha256)
                    for step in steps)
    malformed = Counter(step.malformed_kind for step in records if step.malformed_kind is not None)
    return TrialResult(task_id=trial.task_id, agent=trial.agent, backend=trial.backend, verdict=TrialVerdict(trial.verdict),
                       ending=Ending(trial.ending), reward=trial.reward, detail=trial.detail, steps=records,
                       agent_duration_s=trial.agent_duration_s, verifier_duration_s=trial.verifier_duration_s,
                       duration_s=trial.duration_s, malformed_counts=dict(malformed), started_at_ms=trial.started_at_ms,
                       replay_of=trial.replay_of, replay_from_step=trial.replay_from_step)


class EvalRecorder:
    """Commits the attempts of one eval to the lake (thread-safe: trials finish in parallel)."""

    def __init__(self, store: TrialStore, info: EvalInfo, session: int) -> None:
        self.store = store
        self.info = info
        self.session = session
        self._lock = threading.Lock()

    @staticmethod
    def start(store: TrialStore, info: EvalInfo) -> EvalRecorder:
        """A new eval: EVAL.json is written now (session 0)."""
        store.write_info(info)
        return EvalRecorder(store, info, session=0)

    def record(self, attempt: int, result: TrialResult, instruction: str) -> None:
        trial, steps = trial_rows(self.info.eval_id, attempt, self.session, result, instruction)
        self.store.commit_trial(trial, steps)
        with self._lock:  # hit counts of the failpoint are per process: count commits one at a time
            failpoint("eval-trial-committed")

    def attempts(self) -> dict[str, list[RecordedAttempt]]:
        """task id -> its committed attempts, by attempt number."""
        found: dict[str, list[RecordedAttempt]] = {}
        for commit in self.store.commits(self.info.eval_id):
            trial, steps = self.store.read_trial(commit)
            found.setdefault(trial.task_id, []).append(RecordedAttempt(trial.attempt, trial.session, trial_from_rows(trial, steps)))
        return {task_id: sorted(attempts, key=lambda a: a.attempt) for task_id, attempts in found.items()}

    def next_session(self) -> int:
        """The session number a resume records under: one past the highest stored."""
        sessions = [attempt.session for attempts in self.attempts().values() for attempt in attempts]
        return max(sessions, default=-1) + 1


def now_ms() -> int:
    return int(time.time() * 1000)
