"""An eval: every task of a suite attempted by one agent, in parallel trials, recorded and resumable.

`run_eval` runs one trial per task, `workers` at a time. A trial that ends in an
infrastructure failure (sandbox_error, engine_error, setup_error) is
retried from the task's initial state (a new trial: new sandbox, the initial files, the
setup script) up to `max_attempts` attempts in one session; it is never scored as the
agent's failure, and the last attempt's verdict is the task's. With a recorder
(agents/recording.py) every attempt is committed to the lake as soon as it ends.

Resume (`resume_eval`): the eval's EVAL.json names the agent, backend, task folder and
options; the tasks are loaded again and each task whose last committed attempt has an
agent or not-run verdict is done and not rerun; a task with no committed attempt, or whose
last attempt failed on infrastructure, is run again (up to `max_attempts` more attempts).
The final table is built from the committed attempts, so it equals what an uninterrupted
eval gives for the same trials.

`needs_attempt`, `attempt_task` and `build_report` are the pieces `run_eval` is made of; the
rl-eval Prefect flow (rlpipe/flows/eval.py, tasks/eval_trials.py) runs the same pieces, one
task run per trial. Metrics: agents/metrics.py. What it does not do: report to MLflow or Prefect.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rlpipe.agents.agents import AGENTS, AgentFactory
from rlpipe.agents.backends import TrialBackend, trial_backend
from rlpipe.agents.metrics import eval_metrics
from rlpipe.agents.policy import POLICY_AGENT
from rlpipe.agents.recording import EvalRecorder, RecordedAttempt, TrialStore, now_ms
from rlpipe.agents.records import TrialResult
from rlpipe.agents.task_format import AgentTask, SkippedTask, builtin_suite_dir, load_tasks
from rlpipe.agents.tree_state import ReplayPrefix
from rlpipe.agents.trial import TrialOptions, run_trial
from rlpipe.core.errors import ConfigError, RunNotFoundError
from rlpipe.storage.eval_records import EvalInfo, check_eval_id

DEFAULT_MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class EvalReport:
    agent: str
    backend: str
    trials: tuple[TrialResult, ...]  # the last attempt of each task, in the order of the tasks
    metrics: dict[str, object]
    eval_id: str | None = None
    attempts: dict[str, tuple[RecordedAttempt, ...]] = field(default_factory=dict)  # task id -> every attempt


AGENT_NAMES = (*sorted(AGENTS), POLICY_AGENT)


def check_agent_name(name: str) -> str:
    """`name` if it is an agent (built in, or the policy agent); ConfigError otherwise."""
    if name not in AGENT_NAMES:
        raise ConfigError(f"unknown agent {name!r}", hint=f"use one of {', '.join(AGENT_NAMES)}")
    return name


def agent_factory(name: str) -> AgentFactory:
    """The factory of a built-in agent (the policy agent's is built with its engine:
    agents/policy.policy_agent_factory, controller/eval_policy.py)."""
    check_agent_name(name)
    if name == POLICY_AGENT:
        raise ConfigError("the policy agent needs a model engine; it is built from the eval's agent options",
                          hint="run it through `rlpipe eval --agent policy --gguf FILE` (or --policy DIR)")
    return AGENTS[name]


def needs_attempt(history: Sequence[RecordedAttempt]) -> bool:
    """Whether a task with these committed attempts is run again: none yet, or the last
    one failed on infrastructure."""
    return not history or history[-1].trial.verdict.family == "infrastructure"


def attempt_task(task: AgentTask | SkippedTask, agent: str, factory: AgentFactory, sandboxes: TrialBackend,
                 options: TrialOptions, history: Sequence[RecordedAttempt], session: int,
                 recorder: EvalRecorder | None, replay: ReplayPrefix | None = None) -> RecordedAttempt:
    """One new attempt of `task` (numbered after `history`), committed by `recorder` if any."""
    number = history[-1].attempt + 1 if history else 1
    result = run_trial(task, agent, factory, sandboxes, options, replay)
    if recorder is not None:
        recorder.record(number, result, task.instruction if isinstance(task, AgentTask) else "")
    return RecordedAttempt(number, session, result)


def build_report(tasks: Sequence[AgentTask | SkippedTask], agent: str, backend: str,
                 histories: Sequence[Sequence[RecordedAttempt]], eval_id: str | None) -> EvalReport:
    """The report of tasks whose attempts are `histories` (same order; each non-empty)."""
    trials = tuple(history[-1].trial for history in histories)
    metrics = eval_metrics(trials, attempts=sum(map(len, histories)))
    return EvalReport(agent, backend, trials, metrics, eval_id,
                      {task.task_id: tuple(history) for task, history in zip(tasks, histories)})


def run_eval(tasks: Sequence[AgentTask | SkippedTask], agent: str, backend: str | TrialBackend, workers: int = 2,
             options: TrialOptions = TrialOptions(), max_attempts: int = DEFAULT_MAX_ATTEMPTS,
             recorder: EvalRecorder | None = None, factory: AgentFactory | None = None,
             replay: ReplayPrefix | None = None) -> EvalReport:
    """Each task until it has a verdict that is not an infrastructure failure (at most
    `max_attempts` new attempts); attempts committed by `recorder` earlier count as made."""
    if max_attempts < 1:
        raise ConfigError(f"max attempts {max_attempts} must be at least 1", hint="e.g. --max-attempts 3")
    factory = factory or agent_factory(agent)
    sandboxes = trial_backend(backend, run_id=recorder.info.eval_id if recorder is not None else None)
    recorded = recorder.attempts() if recorder is not None else {}
    session = recorder.session if recorder is not None else 0

    def attempt(task: AgentTask | SkippedTask) -> tuple[RecordedAttempt, ...]:
        history = list(recorded.get(task.task_id, []))
        for _ in range(max_attempts):
            if not needs_attempt(history):
                break
            history.append(attempt_task(task, agent, factory, sandboxes, options, history, session, recorder, replay))
        return tuple(history)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        histories = list(pool.map(attempt, tasks))
    return build_report(tasks, agent, sandboxes.name, histories, recorder.info.eval_id if recorder is not None else None)


def start_eval(store: TrialStore, eval_id: str, agent: str, backend: str, tasks_dir: Path | None,
               tasks: Sequence[AgentTask | SkippedTask], options: TrialOptions, max_attempts: int,
               agent_options: dict[str, object] | None = None, replay_of: str | None = None,
               replay_from_step: int | None = None) -> EvalRecorder:
    """Write EVAL.json of a new eval; ConfigError when the id is taken."""
    if store.read_info(check_eval_id(eval_id)) is not None:
        raise ConfigError(f"eval {eval_id!r} already exists in {store.uri}",
                          hint=f"resume it with `rlpipe eval --resume {eval_id}`, or pick another --eval-id")
    ids = [task.task_id for task in tasks]
    if len(set(ids)) != len(ids):
        raise ConfigError("two tasks have the same id: " + ", ".join(sorted({i for i in ids if ids.count(i) > 1})),
                          hint="task ids are folder names; rename one of the folders")
    info = EvalInfo(eval_id=eval_id, agent=agent, backend=backend,
                    tasks_dir="" if tasks_dir is None else str(tasks_dir.resolve()), task_ids=tuple(ids),
                    max_attempts=max_attempts, command_timeout_s=options.command_timeout_s, created_at_ms=now_ms(),
                    agent_options=dict(agent_options or {}), replay_of=replay_of, replay_from_step=replay_from_step)
    return EvalRecorder.start(store, info)


def resume_eval(store: TrialStore, eval_id: str) -> tuple[EvalRecorder, list[AgentTask | SkippedTask], TrialOptions]:
    """The recorder (next session), the eval's tasks loaded again, and its options."""
    info = store.read_info(check_eval_id(eval_id))
    if info is None:
        known = ", ".join(store.list_evals()[-5:]) or "none"
        raise RunNotFoundError(f"the lake {store.uri} holds no eval {eval_id!r}", hint=f"evals there: {known}; "
                               "query them with `rlpipe query \"select * from evals\"`")
    tasks = load_tasks(Path(info.tasks_dir) if info.tasks_dir else builtin_suite_dir())
    by_id = {task.task_id: task for task in tasks}
    missing = [task_id for task_id in info.task_ids if task_id not in by_id]
    if missing:
        raise ConfigError(f"eval {eval_id!r} ran tasks that {info.tasks_dir or 'the built-in suite'} no longer holds: "
                          f"{', '.join(missing)}", hint="restore those task folders, or start a new eval")
    recorder = EvalRecorder(store, info, session=0)
    recorder = EvalRecorder(store, info, session=recorder.next_session())
    return recorder, [by_id[task_id] for task_id in info.task_ids], TrialOptions(command_timeout_s=info.command_timeout_s)
