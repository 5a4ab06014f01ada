"""`rlpipe eval [--tasks DIR] --agent A [--backend B] [--json]`: run agents on terminal tasks.

Loads Harbor-format task folders (the built-in suite when --tasks is not given), runs one
trial per task (agents/trial.py) in sandboxes of the chosen backend, `--workers` at a time,
retries infrastructure failures (`--max-attempts` attempts per task), commits every attempt
to the lake (`--lake`, under evals/{eval id}/, queryable as eval_trials / eval_steps) as
soon as it ends, and prints a table of the trials and the metrics (agents/metrics.py);
`--json` prints one JSON object: the eval id, the metrics, and the trials without their
trajectories. `--resume EVAL_ID` goes on with a stored eval: finished trials are not rerun;
trials never committed and trials whose last attempt failed on infrastructure are.

Exit codes: 0 when the eval ran, whatever the success rate; 2 for bad input (a missing or
empty task folder, an unknown agent or backend, a taken eval id, an unknown eval to resume,
options that contradict the resumed eval). An unavailable sandbox backend is not bad input:
its trials are recorded as sandbox_error (infrastructure) and the eval exits 0.

What it does not do: report to MLflow or Prefect (see docs/AGENTS.md).
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from rlpipe.agents.evaluation import DEFAULT_MAX_ATTEMPTS, EvalReport, agent_factory, resume_eval, run_eval, start_eval
from rlpipe.agents.task_format import builtin_suite_dir, load_tasks
from rlpipe.agents.trial import TrialOptions
from rlpipe.cli.consoles import literal, stdout_console
from rlpipe.cli.sandbox import Backend
from rlpipe.core.config import StorageConfig
from rlpipe.core.errors import ConfigError, LakeNotFoundError
from rlpipe.storage.evals import EvalStore
from rlpipe.storage.filesystem import open_lake_location
from rlpipe.storage.lake import Lake

console = stdout_console()
DEFAULT_LAKE = StorageConfig().lake_uri


def eval_command(
    tasks: Optional[Path] = typer.Option(None, "--tasks", help="A Harbor-format task folder, or a folder of them "
                                         "(default: the built-in suite)."),
    agent: Optional[str] = typer.Option(None, "--agent", help="The agent: oracle (runs solution/solve.sh) or noop "
                                        "(submits at once). Required unless --resume."),
    backend: Optional[Backend] = typer.Option(None, "--backend", help="Sandbox backend (default bwrap)."),
    workers: int = typer.Option(2, "--workers", help="Trials run at once."),
    command_timeout_s: float = typer.Option(120.0, "--command-timeout-s", help="Longest single bash call (also capped by "
                                            "the task's agent timeout)."),
    max_attempts: int = typer.Option(DEFAULT_MAX_ATTEMPTS, "--max-attempts", help="Attempts per task when trials fail "
                                     "on infrastructure (sandbox died, setup error, ...)."),
    lake: str = typer.Option(DEFAULT_LAKE, "--lake", help="Lake URI (folder or s3://bucket/prefix) the trials are committed to."),
    eval_id: Optional[str] = typer.Option(None, "--eval-id", help="Id of the new eval (default: generated)."),
    resume: Optional[str] = typer.Option(None, "--resume", help="Go on with this eval: rerun only unfinished trials and "
                                         "trials that failed on infrastructure."),
    json_out: bool = typer.Option(False, "--json", help="Print the metrics and trials as one JSON object."),
    mlflow_uri: Optional[str] = typer.Option(None, "--mlflow-uri", help="MLflow tracking URI (default: the MLflow of "
                                             "`rlpipe up` if it runs, else sqlite ./mlruns.db)."),
    experiment: str = typer.Option("rlpipe-eval", "--experiment", help="MLflow experiment of the eval's run."),
) -> None:
    """Run an agent on every task; commit each trial to the lake; print each verdict and the success rate."""
    if workers < 1:
        raise ConfigError(f"--workers {workers} must be at least 1", hint="e.g. --workers 2")
    if max_attempts < 1:
        raise ConfigError(f"--max-attempts {max_attempts} must be at least 1", hint="e.g. --max-attempts 3")
    if resume is not None:
        report, lake_uri, recorder, loaded = _resume(resume, lake, tasks, agent, backend, eval_id, workers, max_attempts)
    else:
        if agent is None:
            raise ConfigError("--agent is required for a new eval", hint="e.g. --agent oracle (or --resume EVAL_ID)")
        agent_factory(agent)  # an unknown agent is bad input before any sandbox starts
        backend_name = (backend or Backend.bwrap).value
        loaded = load_tasks(tasks if tasks is not None else builtin_suite_dir())
        options = TrialOptions(command_timeout_s=command_timeout_s)
        opened = Lake.open(lake)
        eval_id = eval_id or f"eval-{agent}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        recorder = start_eval(EvalStore(opened), eval_id, agent, backend_name, tasks, loaded, options, max_attempts)
        report, lake_uri = run_eval(loaded, agent, backend_name, workers, options, max_attempts, recorder), opened.uri
    from rlpipe.tasks.eval_tracking import build_eval_tracker, track_eval

    kinds = {task.task_id: getattr(task, "category", "") for task in loaded}
    tracked = track_eval(build_eval_tracker(mlflow_uri, experiment), recorder.info, report, recorder.session, kinds,
                         lake_uri, workers)
    _print_report(report, lake_uri, json_out, tracked)


def _resume(eval_id: str, lake: str, tasks: Optional[Path], agent: Optional[str], backend: Optional[Backend],
            new_id: Optional[str], workers: int, max_attempts: int):
    try:
        opened = Lake(open_lake_location(lake, create=False))
    except LakeNotFoundError as exc:
        raise LakeNotFoundError(exc.message, hint="point --lake at the lake the eval was committed to") from None
    recorder, loaded, options = resume_eval(EvalStore(opened), eval_id)
    info = recorder.info
    given = {"--agent": (agent, info.agent), "--backend": (backend.value if backend else None, info.backend),
             "--tasks": (str(tasks.resolve()) if tasks else None, info.tasks_dir or None),
             "--eval-id": (new_id, eval_id)}
    clashes = [f"{flag} {mine} (the eval has {theirs or 'the built-in suite'})"
               for flag, (mine, theirs) in given.items() if mine is not None and mine != theirs]
    if clashes:
        raise ConfigError(f"--resume {eval_id} goes on with the eval's own settings, not {'; '.join(clashes)}",
                          hint=f"drop those options (`rlpipe eval --resume {eval_id} --lake {opened.uri}`), or start a new eval")
    return run_eval(loaded, info.agent, info.backend, workers, options, max_attempts, recorder), opened.uri, recorder, loaded


def _print_report(report: EvalReport, lake_uri: str, json_out: bool, tracked) -> None:
    attempts = {task_id: len(history) for task_id, history in report.attempts.items()}
    if json_out:
        trials = [{"task_id": t.task_id, "verdict": t.verdict.value, "family": t.verdict.family, "ending": t.ending.value,
                   "reward": t.reward, "steps": len(t.steps), "attempts": attempts.get(t.task_id, 1),
                   "duration_s": round(t.duration_s, 3), "detail": t.detail} for t in report.trials]
        typer.echo(json.dumps({"eval_id": report.eval_id, "lake": lake_uri, "agent": report.agent, "backend": report.backend,
                               "mlflow": {"tracking_uri": tracked.tracking_uri, "run_id": tracked.mlflow_run_id,
                                          "run_url": tracked.mlflow_run_url, "report": tracked.report_uri},
                               "metrics": report.metrics, "trials": trials}))
        return
    table = Table(title=f"{len(report.trials)} tasks, agent {report.agent}, backend {report.backend}")
    for column in ("task", "verdict", "reward", "steps", "tries", "s", "detail"):
        table.add_column(column)
    for trial in report.trials:
        detail = trial.detail.strip().splitlines()[-1][:70] if trial.detail.strip() else ""
        reward = "" if trial.reward is None else f"{trial.reward:g}"
        table.add_row(trial.task_id, trial.verdict.value, reward, str(len(trial.steps)), str(attempts.get(trial.task_id, 1)),
                      f"{trial.duration_s:.2f}", literal(detail))
    console.print(table)
    metrics = report.metrics
    verdicts = ", ".join(f"{name} {count}" for name, count in metrics["verdicts"].items())
    console.print(f"success_rate = {metrics['success_rate']:.3f} ({metrics['passed']}/{metrics['scored']} scored; "
                  f"{metrics['infrastructure_failures']} infrastructure failures, {metrics['not_run']} not run; "
                  f"{metrics['infrastructure_retries']} retries)  verdicts: {verdicts}")
    console.print(f"steps p50 {metrics['steps_p50']:g} p90 {metrics['steps_p90']:g}; duration p50 {metrics['duration_s_p50']:.2f} s "
                  f"p90 {metrics['duration_s_p90']:.2f} s; well-formed calls {metrics['well_formed_rate']:.3f}, "
                  f"bash exit 0 {metrics['bash_exit_zero_rate']:.3f}")
    console.print(f"eval {literal(report.eval_id or '')}  lake {literal(lake_uri)}  "
                  f"(rlpipe query \"select * from eval_trials where eval_id = '{report.eval_id}' and final\")", soft_wrap=True)
    console.print(f"mlflow  {literal(tracked.mlflow_run_url or tracked.tracking_uri)}  run {literal(tracked.mlflow_run_id)}", soft_wrap=True)
    console.print(f"report  {literal(tracked.report_uri)}", soft_wrap=True)
