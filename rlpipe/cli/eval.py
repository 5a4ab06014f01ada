"""`rlpipe eval [--tasks DIR] --agent A [--backend B] [--json]`: run agents on terminal tasks.

Loads Harbor-format task folders (the built-in suite when --tasks is not given), runs one
trial per task (agents/trial.py) in sandboxes of the chosen backend, `--workers` at a time,
retries infrastructure failures (`--max-attempts` attempts per task), commits every attempt
to the lake (`--lake`, under evals/{eval id}/, queryable as eval_trials / eval_steps) as
soon as it ends, and prints a table of the trials and the metrics (agents/metrics.py);
`--json` prints one JSON object: the eval id, the metrics, and the trials without their
trajectories. `--resume EVAL_ID` goes on with a stored eval: finished trials are not rerun;
trials never committed and trials whose last attempt failed on infrastructure are.

Exit codes: 0 when the eval ran, whatever the success rate; 1 when a trial could not be
recorded in the lake (the report lacks it; the error names it and how to go on); 2 for bad input (a missing or
empty task folder, an unknown agent or backend, a taken eval id, an unknown eval to resume,
options that contradict the resumed eval). An unavailable sandbox backend is not bad input:
its trials are recorded as sandbox_error (infrastructure) and the eval exits 0.

The trials run in the Prefect flow `rl-eval` (rlpipe/flows/eval.py: one task run per trial,
`--workers` at a time, infrastructure failures as Prefect retries) on Prefect's temporary
server unless PREFECT_API_URL or `rlpipe up` gives one; the eval is one MLflow run
(`--mlflow-uri`, `--experiment`) with its metrics and a report (markdown + PNG plots), whose
run id and report URI are printed. ^C or SIGTERM: the trials in flight finish and are
committed, one line says how to resume, exit 130 / 143.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from rlpipe.agents.evaluation import DEFAULT_MAX_ATTEMPTS, EvalReport, check_agent_name, resume_eval, start_eval
from rlpipe.agents.task_format import builtin_suite_dir, load_tasks
from rlpipe.agents.trial import TrialOptions
from rlpipe.cli import agent_options
from rlpipe.cli.consoles import literal, stdout_console
from rlpipe.cli.errors import print_error
from rlpipe.cli.sandbox import Backend
from rlpipe.core.config import StorageConfig
from rlpipe.core.errors import ConfigError, InfraError, LakeNotFoundError
from rlpipe.storage.evals import EvalStore
from rlpipe.storage.filesystem import open_lake_location
from rlpipe.storage.lake import Lake
from rlpipe.sandbox.docker_owners import reap_in_background

console = stdout_console()
DEFAULT_LAKE = StorageConfig().lake_uri


def eval_command(
    ctx: typer.Context,
    tasks: Optional[Path] = typer.Option(None, "--tasks", help="A Harbor-format task folder, or a folder of them "
                                         "(default: the built-in suite)."),
    agent: Optional[str] = typer.Option(None, "--agent", help="The agent: oracle (runs solution/solve.sh), noop "
                                        "(submits at once) or policy (a model: --gguf/--policy, see the policy options). "
                                        "Required unless --resume."),
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
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show Prefect's task logs."),
    policy: Optional[Path] = agent_options.POLICY,
    gguf: Optional[Path] = agent_options.GGUF,
    engine: agent_options.EngineName = agent_options.ENGINE,
    openai_base_url: Optional[str] = agent_options.OPENAI_BASE_URL,
    openai_model: Optional[str] = agent_options.OPENAI_MODEL,
    config: Optional[Path] = agent_options.RUN_CONFIG,
    device: Optional[str] = agent_options.DEVICE,
    temperature: float = agent_options.TEMPERATURE,
    top_p: float = agent_options.TOP_P,
    max_new_tokens: int = agent_options.MAX_NEW_TOKENS,
    seed: int = agent_options.SEED,
    context_tokens: int = agent_options.CONTEXT_TOKENS,
    episode_tokens: Optional[int] = agent_options.EPISODE_TOKENS,
    max_observation_chars: int = agent_options.MAX_OBSERVATION_CHARS,
    system_prompt: str = agent_options.SYSTEM_PROMPT,
) -> None:
    """Run an agent on every task; commit each trial to the lake; print each verdict and the success rate."""
    if ctx.invoked_subcommand is not None:
        return  # `rlpipe eval replay ...`
    reap_in_background()  # containers a killed eval left, whatever this eval's backend (docker_owners.py)
    if workers < 1:
        raise ConfigError(f"--workers {workers} must be at least 1", hint="e.g. --workers 2")
    if max_attempts < 1:
        raise ConfigError(f"--max-attempts {max_attempts} must be at least 1", hint="e.g. --max-attempts 3")
    if resume is not None:
        agent_options.policy_options(None, policy, gguf, engine, openai_base_url, openai_model, config, device, temperature,
                                     top_p, max_new_tokens, seed, context_tokens, episode_tokens, max_observation_chars,
                                     system_prompt=system_prompt)
        eval_id, lake_uri = _resume(resume, lake, tasks, agent, backend, eval_id)
    else:
        if agent is None:
            raise ConfigError("--agent is required for a new eval", hint="e.g. --agent oracle (or --resume EVAL_ID)")
        check_agent_name(agent)  # an unknown agent is bad input before any sandbox starts
        chosen = agent_options.policy_options(agent, policy, gguf, engine, openai_base_url, openai_model, config, device,
                                              temperature, top_p, max_new_tokens, seed, context_tokens, episode_tokens,
                                              max_observation_chars, system_prompt=system_prompt)
        backend_name = (backend or Backend.bwrap).value
        loaded = load_tasks(tasks if tasks is not None else builtin_suite_dir())
        options = TrialOptions(command_timeout_s=command_timeout_s)
        opened = Lake.open(lake)
        eval_id = eval_id or f"eval-{agent}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        start_eval(EvalStore(opened), eval_id, agent, backend_name, tasks, loaded, options, max_attempts,
                   agent_options=chosen.to_dict() if chosen else None)
        lake_uri = opened.uri
    summary = _run_flow(eval_id, lake_uri, workers, max_attempts, mlflow_uri, experiment, verbose)
    _print_report(summary.report, lake_uri, json_out, summary.tracking, summary.prefect_flow_run_id)
    if summary.unrecorded:  # every trial is in the report, or the command says which are not, and fails
        print_error(InfraError(f"{len(summary.unrecorded)} trial(s) could not be recorded in the lake: "
                               f"{', '.join(summary.unrecorded)}",
                               hint=f"check the lake, then go on: rlpipe eval --resume {eval_id} --lake {lake_uri}"))
        raise typer.Exit(1)


def _run_flow(eval_id: str, lake_uri: str, workers: int, max_attempts: int, mlflow_uri: Optional[str], experiment: str,
              verbose: bool):
    """The rl-eval flow on Prefect's temporary server (or `rlpipe up`'s); on ^C or SIGTERM:
    trials in flight finish and are committed, one line with the resume command, exit 130/143."""
    from rlpipe.cli import services as services_cli
    from rlpipe.cli.signals import exit_code, hold_signals, sigterm_raises

    services_cli.export_service_env(verbose)
    if not verbose:
        for name in ("mlflow", "alembic", "httpx"):
            logging.getLogger(name).setLevel(logging.WARNING)
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    from rlpipe.flows.eval import run_eval_flow
    from rlpipe.orchestration.prefect_server import temporary_prefect_server
    from rlpipe.orchestration.status import interruption

    signal_name = None
    with sigterm_raises():
        try:
            with temporary_prefect_server():  # stopped last, after the flow run has recorded its end
                try:
                    return run_eval_flow(eval_id, lake_uri, workers, max_attempts, mlflow_uri, experiment)
                except BaseException as exc:
                    if interruption(exc):
                        hold_signals()  # the trials in flight, the server's stop: bounded waits
                    raise
        except BaseException as exc:
            signal_name = interruption(exc)
            if signal_name is None:
                raise
    console.print(f"[yellow]interrupted ({signal_name})[/]; trials in flight were committed; resume with: "
                  f"rlpipe eval --resume {eval_id} --lake {lake_uri}", soft_wrap=True)
    raise typer.Exit(exit_code(signal_name))


def _resume(eval_id: str, lake: str, tasks: Optional[Path], agent: Optional[str], backend: Optional[Backend],
            new_id: Optional[str]) -> tuple[str, str]:
    """Check that the eval exists and that the options given agree with it: (eval id, lake URI)."""
    try:
        opened = Lake(open_lake_location(lake, create=False))
    except LakeNotFoundError as exc:
        raise LakeNotFoundError(exc.message, hint="point --lake at the lake the eval was committed to") from None
    recorder, _, _ = resume_eval(EvalStore(opened), eval_id)
    info = recorder.info
    if info.replay_of is not None:
        raise ConfigError(f"eval {eval_id!r} is a replay of trial {info.replay_of}; a replay is not resumed",
                          hint=f"run it again: rlpipe eval replay {info.replay_of} --from-step {info.replay_from_step} --agent ...")
    given = {"--agent": (agent, info.agent), "--backend": (backend.value if backend else None, info.backend),
             "--tasks": (str(tasks.resolve()) if tasks else None, info.tasks_dir or None),
             "--eval-id": (new_id, eval_id)}
    clashes = [f"{flag} {mine} (the eval has {theirs or 'the built-in suite'})"
               for flag, (mine, theirs) in given.items() if mine is not None and mine != theirs]
    if clashes:
        raise ConfigError(f"--resume {eval_id} goes on with the eval's own settings, not {'; '.join(clashes)}",
                          hint=f"drop those options (`rlpipe eval --resume {eval_id} --lake {opened.uri}`), or start a new eval")
    return eval_id, opened.uri


def _print_report(report: EvalReport, lake_uri: str, json_out: bool, tracked, flow_run_id: str) -> None:
    attempts = {task_id: len(history) for task_id, history in report.attempts.items()}
    if json_out:
        trials = [{"task_id": t.task_id, "verdict": t.verdict.value, "family": t.verdict.family, "ending": t.ending.value,
                   "reward": t.reward, "steps": len(t.steps), "attempts": attempts.get(t.task_id, 1),
                   "duration_s": round(t.duration_s, 3), "detail": t.detail} for t in report.trials]
        typer.echo(json.dumps({"eval_id": report.eval_id, "lake": lake_uri, "agent": report.agent, "backend": report.backend,
                               "mlflow": {"tracking_uri": tracked.tracking_uri, "run_id": tracked.mlflow_run_id,
                                          "run_url": tracked.mlflow_run_url, "report": tracked.report_uri},
                               "prefect_flow_run_id": flow_run_id,
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
    console.print(f"prefect flow run rl-eval/{literal(report.eval_id or '')}  {literal(flow_run_id)}", soft_wrap=True)
