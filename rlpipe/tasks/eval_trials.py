"""The tasks of the rl-eval flow: open an eval, one task run per trial, the summary.

    open-eval  (eval id, lake) -> the eval's EvalRuntime in this process (recorder, tasks,
               agent, backend) from EVAL.json; `pending()`: the tasks that need a trial
    trial      (runtime, task id) -> the final verdict; one attempt per Prefect run
    summarize-eval (runtime, ...) -> EvalSummary; the report (from the lake), the MLflow
               run (controller/eval_tracking.py) and the Prefect artifacts (markdown + table)

Retries of a trial are Prefect retries. A trial whose attempt ends in an infrastructure
verdict (sandbox_error, engine_error, setup_error) has already been
committed to the lake as that attempt; the task then raises TrialInfrastructureFailure (an
InfraError), and Prefect retries it (`retries = max_attempts - 1`, the stage back-off,
retry_infra_errors_only): the retry is a new attempt from the task's initial state. So a
retried trial shows in the UI as one task run with its retries and their logs, the back-off
gives a dying sandbox daemon time, and the lake keeps every attempt. A trial that fails on
infrastructure every time ends Failed; the flow goes on, and the summary counts it as an
infrastructure failure, never as the agent's. Agent verdicts (passed, failed, timeouts,
...) are data: the task completes.

The tasks share an EvalRuntime, passed by reference: open-eval builds it in this process
(the loaded tasks, the recorder, the backend, the agent factory; for the policy agent, its
engine worker too: controller/eval_policy.py, started by open-eval when a trial needs it),
the flow hands it to every trial and to the summary, and closes it in `finally`, which stops
that engine. The tasks cache nothing and persist no result, so Prefect neither hashes nor
stores it; there is no registry of evals by id. A test or a benchmark may give open-eval its
own TrialBackend (our protocol) in place of the one EVAL.json names.

What it does not do: decide the fan-out or the concurrency (flows/eval.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from rlpipe.agents.agents import AgentFactory
from rlpipe.agents.backends import TrialBackend, trial_backend
from rlpipe.agents.evaluation import (EvalReport, agent_factory, attempt_task, build_report, check_agent_name, needs_attempt,
                                      resume_eval)
from rlpipe.agents.policy import POLICY_AGENT, PolicyOptions, policy_agent_factory
from rlpipe.agents.recording import EvalRecorder, RecordedAttempt
from rlpipe.agents.task_format import AgentTask, SkippedTask
from rlpipe.agents.trial import TrialOptions
from rlpipe.controller.eval_policy import WorkerChatEngine, open_policy_engine
from rlpipe.controller.eval_tracking import EvalTracking, build_eval_tracker, track_eval
from rlpipe.core.errors import InfraError
from rlpipe.orchestration.stage_options import STAGE_OPTIONS, STAGE_RETRY_DELAYS, STAGE_RETRY_JITTER, retry_infra_errors_only
from rlpipe.orchestration.track import artifact_key
from rlpipe.storage.eval_records import EvalInfo
from rlpipe.storage.evals import EvalStore
from rlpipe.storage.filesystem import open_lake_location
from rlpipe.storage.lake import Lake

TABLE_COLUMNS = ("task", "kind", "verdict", "reward", "steps", "attempts", "duration_s")


class TrialInfrastructureFailure(InfraError):
    """The trial's attempt failed on infrastructure (committed as such): retry the trial."""


class EvalRuntime:
    """What the tasks of one eval share in this process: built by open-eval, passed by
    reference, closed by the flow. A plain class, not a dataclass: Prefect walks a dataclass
    task parameter field by field on every task call."""

    def __init__(self, recorder: EvalRecorder, tasks: dict[str, AgentTask | SkippedTask], backend: TrialBackend,
                 options: TrialOptions, lake_uri: str, histories: dict[str, list[RecordedAttempt]],
                 factory: AgentFactory | None = None, engine: WorkerChatEngine | None = None) -> None:
        self.recorder = recorder
        self.tasks = tasks
        self.backend = backend
        self.options = options
        self.lake_uri = lake_uri
        self.histories = histories  # task id -> its attempts so far (trials append, under `lock`)
        self.factory = factory  # the agent of every trial (a policy agent's holds its engine)
        self.engine = engine  # the policy agent's engine worker, stopped by `close`
        self.lock = threading.Lock()

    def __repr__(self) -> str:  # Prefect may name a parameter in a log line
        return f"EvalRuntime(eval_id={self.recorder.info.eval_id!r})"

    def pending(self) -> list[str]:
        """The ids of the tasks that need a trial: none committed, or the last one failed on infrastructure."""
        with self.lock:
            return [task_id for task_id in self.tasks if needs_attempt(self.histories.get(task_id, []))]

    def close(self) -> None:
        """Stop the policy agent's engine worker, if one was started."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None


@dataclass(frozen=True)
class EvalSummary:
    """What the flow returns: where the eval is recorded and its metrics."""

    eval_id: str
    lake_uri: str
    session: int
    metrics: dict[str, object]
    tracking: EvalTracking | None
    prefect_flow_run_id: str
    report: EvalReport  # the final attempt of each task (kept in this process; not a Prefect result)
    unrecorded: tuple[str, ...] = ()  # tasks of the eval with no attempt in the lake: a trial that could not be recorded


def _agent(info: EvalInfo) -> tuple[AgentFactory, WorkerChatEngine | None]:
    """The eval's agent factory; for the policy agent, its engine worker started (and ready)."""
    if info.agent != POLICY_AGENT:
        return agent_factory(info.agent), None
    options = PolicyOptions.from_dict(info.agent_options)
    engine = open_policy_engine(options, info.eval_id)
    return policy_agent_factory(engine, options.context(), options.system_override()), engine


@task(name="open-eval", cache_policy=NO_CACHE, persist_result=False, **STAGE_OPTIONS)
def open_eval(eval_id: str, lake_uri: str, backend: TrialBackend | None = None) -> EvalRuntime:
    """The eval's runtime, built from its EVAL.json and the lake (`backend`: in place of the
    one EVAL.json names). The caller closes it."""
    lake = Lake(open_lake_location(lake_uri, create=False))
    recorder, tasks, options = resume_eval(EvalStore(lake), eval_id)
    histories = {k: list(v) for k, v in recorder.attempts().items()}
    pending = [task.task_id for task in tasks if needs_attempt(histories.get(task.task_id, []))]
    check_agent_name(recorder.info.agent)  # an unknown agent fails here, before any trial
    # the policy agent's engine starts only when a trial needs it
    factory, engine = _agent(recorder.info) if pending or recorder.info.agent != POLICY_AGENT else (None, None)
    return EvalRuntime(recorder, {t.task_id: t for t in tasks}, backend or trial_backend(recorder.info.backend, run_id=eval_id),
                       options, lake.uri, histories, factory=factory, engine=engine)


@task(name="trial", task_run_name="{task_id}", cache_policy=NO_CACHE, persist_result=False,
      retry_delay_seconds=STAGE_RETRY_DELAYS, retry_jitter_factor=STAGE_RETRY_JITTER, retry_condition_fn=retry_infra_errors_only)
def trial(runtime: EvalRuntime, task_id: str) -> str:
    """One attempt of the task, committed to the lake; its verdict. Raises
    TrialInfrastructureFailure after committing an infrastructure verdict (Prefect retries)."""
    with runtime.lock:
        history = list(runtime.histories.get(task_id, []))
    info = runtime.recorder.info
    attempt = attempt_task(runtime.tasks[task_id], info.agent, runtime.factory or agent_factory(info.agent), runtime.backend, runtime.options,
                           history, runtime.recorder.session, runtime.recorder)
    with runtime.lock:
        runtime.histories.setdefault(task_id, []).append(attempt)
    verdict = attempt.trial.verdict
    if verdict.family == "infrastructure":
        raise TrialInfrastructureFailure(f"trial {task_id} attempt {attempt.attempt}: {verdict.value}: {attempt.trial.detail[:300]}",
                                         hint="retried from the task's initial state; every attempt is in the lake")
    return verdict.value


@task(name="summarize-eval", cache_policy=NO_CACHE, **STAGE_OPTIONS)
def summarize_eval(runtime: EvalRuntime, workers: int, mlflow_uri: str | None, experiment: str,
                   track: bool = True) -> EvalSummary:
    """The report from the committed attempts, logged to MLflow; Prefect artifacts of it."""
    eval_id = runtime.recorder.info.eval_id
    recorded = runtime.recorder.attempts()  # the lake is the truth
    ran = [task for task_id, task in runtime.tasks.items() if recorded.get(task_id)]
    info = runtime.recorder.info
    report = build_report(ran, info.agent, runtime.backend.name, [recorded[t.task_id] for t in ran], eval_id)
    kinds = {t.task_id: t.category for t in ran if isinstance(t, AgentTask)}
    flow_run_id = str(flow_run.get_id() or "")
    tracking = None
    if track:
        tracking = track_eval(build_eval_tracker(mlflow_uri, experiment), info, report, runtime.recorder.session, kinds,
                              runtime.lake_uri, workers, {"prefect.flow_run_id": flow_run_id})
    _artifacts(eval_id, report, kinds, tracking, runtime.recorder.session)
    unrecorded = tuple(task_id for task_id in runtime.tasks if not recorded.get(task_id))
    return EvalSummary(eval_id, runtime.lake_uri, runtime.recorder.session, report.metrics, tracking, flow_run_id, report,
                       unrecorded)


def _artifacts(eval_id: str, report: EvalReport, kinds: dict[str, str], tracking: EvalTracking | None, session: int) -> None:
    m = report.metrics
    failures = "; ".join(f"{family}: " + (", ".join(f"{k} {v}" for k, v in counts.items()) or "none")
                         for family, counts in m["failure_modes"].items())
    lines = [f"# Eval {eval_id} (session {session})", "",
             f"agent `{report.agent}`, backend `{report.backend}`: success rate **{m['success_rate']:.3f}** "
             f"({m['passed']}/{m['scored']} scored), {m['infrastructure_failures']} infrastructure failures, "
             f"{m['not_run']} not run, {m['infrastructure_retries']} retries.", "",
             f"steps p50 {m['steps_p50']:g} p90 {m['steps_p90']:g}; duration p50 {m['duration_s_p50']:.2f} s "
             f"p90 {m['duration_s_p90']:.2f} s; well-formed calls {m['well_formed_rate']:.3f}.", "",
             f"failure modes: {failures}"]
    if tracking is not None:
        lines += ["", f"MLflow run `{tracking.mlflow_run_id}` ({tracking.mlflow_run_url or tracking.tracking_uri}); "
                  f"report: {tracking.report_uri}"]
    key = f"rlpipe-eval-{artifact_key(eval_id)}"
    create_markdown_artifact(markdown="\n".join(lines) + "\n", key=key, description=f"Summary of eval {eval_id}")
    rows = [{"task": t.task_id, "kind": kinds.get(t.task_id, ""), "verdict": t.verdict.value,
             "reward": "" if t.reward is None else t.reward, "steps": len(t.steps),
             "attempts": len(report.attempts.get(t.task_id, ())), "duration_s": round(t.duration_s, 3)}
            for t in report.trials]
    create_table_artifact(table=rows, key=f"{key}-trials", description=f"Final trial of each task of eval {eval_id}")
