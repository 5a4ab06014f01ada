"""The `rl-eval` flow: one flow run per eval session, one task run per trial.

    rl-eval: open-eval -> trial(task 1) | trial(task 2) | ... (fanned out, `workers` at a time)
             -> summarize-eval (report from the lake, MLflow run, Prefect artifacts)

The eval must exist in the lake (EVAL.json, written by `rlpipe eval` through
agents.evaluation.start_eval); the same flow starts it and resumes it: open-eval returns
only the tasks with no committed attempt or whose last attempt failed on infrastructure.
At most `workers` trials (sandboxes) run at once: the flow keeps that many task runs in
flight and submits the next as one ends, whatever its task runner (a served deployment runs
the flow with Prefect's default one, unbounded); `run_eval_flow` also gives it a
ThreadPoolTaskRunner of `workers` threads. A trial's infrastructure failures are Prefect retries of its task run
(`max_attempts - 1` retries; see tasks/eval_trials.py); a trial that fails on
infrastructure every time leaves its task run Failed and the flow goes on: the summary
scores it as infrastructure, never as the agent's.

On ^C the task runner cancels the trials not started yet and waits for those in flight
(each bounded by its task's time limits), which are committed; `--resume` runs the rest.

Flows import only tasks/ and core/ (an import-linter contract).
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.futures import PrefectFuture, as_completed, wait
from prefect.task_runners import ThreadPoolTaskRunner

from rlpipe.controller.eval_tracking import DEFAULT_EVAL_EXPERIMENT
from rlpipe.core.errors import ConfigError
from rlpipe.tasks import eval_trials
from rlpipe.tasks.eval_trials import EvalRuntime, EvalSummary


@flow(name="rl-eval", flow_run_name="{eval_id}")
def rl_eval(eval_id: str, lake_uri: str, workers: int = 2, max_attempts: int = 3, mlflow_uri: str | None = None,
            experiment: str = DEFAULT_EVAL_EXPERIMENT, track: bool = True, trial_backend: Any = None) -> EvalSummary:
    """Run every unfinished trial of a stored eval; record, report and track it. `trial_backend`:
    a TrialBackend object in place of the one the eval names (tests and benchmarks, in process;
    a deployment's run leaves it empty)."""
    if workers < 1 or max_attempts < 1:
        raise ConfigError(f"workers {workers} and max_attempts {max_attempts} must be at least 1",
                          hint="e.g. --workers 2 --max-attempts 3")
    if trial_backend is not None and not callable(getattr(trial_backend, "open", None)):
        raise ConfigError(f"trial_backend {trial_backend!r} is not a TrialBackend object (tests pass one in process)",
                          hint="leave trial_backend empty: the trials use the backend the eval names")
    runtime: EvalRuntime | None = None
    try:
        # 1. The eval's runtime (passed to every task by reference), and the tasks that still need a trial.
        runtime = eval_trials.open_eval(eval_id, lake_uri, trial_backend)
        # 2. One task run per trial, `workers` in flight at a time.
        trial = eval_trials.trial.with_options(retries=max_attempts - 1)
        in_flight: list[PrefectFuture] = []
        for task_id in runtime.pending():
            if len(in_flight) >= workers:
                in_flight.remove(next(as_completed(in_flight)))
            in_flight.append(trial.submit(runtime, task_id))
        wait(in_flight)  # a Failed trial (infrastructure every time) is in the lake; the summary counts it
        # 3. The report from the lake, the MLflow run, the Prefect artifacts.
        return eval_trials.summarize_eval(runtime, workers, mlflow_uri, experiment, track)
    finally:
        if runtime is not None:
            runtime.close()  # the policy agent's engine worker


def run_eval_flow(eval_id: str, lake_uri: str, workers: int = 2, max_attempts: int = 3, mlflow_uri: str | None = None,
                  experiment: str = DEFAULT_EVAL_EXPERIMENT, track: bool = True, trial_backend: Any = None) -> EvalSummary:
    """rl-eval with `workers` threads in its task runner (the concurrency limit)."""
    runner = ThreadPoolTaskRunner(max_workers=max(1, workers))
    return rl_eval.with_options(task_runner=runner)(eval_id, lake_uri, workers, max_attempts, mlflow_uri, experiment, track,
                                                    trial_backend)
