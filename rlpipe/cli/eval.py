"""`rlpipe eval [--tasks DIR] --agent A [--backend B] [--json]`: run agents on terminal tasks.

Loads Harbor-format task folders (the built-in suite when --tasks is not given), runs one
trial per task (agents/trial.py) in sandboxes of the chosen backend, `--workers` at a time,
and prints a table of the trials and the metrics (agents/evaluation.py); `--json` prints one
JSON object: the metrics, and the trials without their trajectories.

Exit codes: 0 when the eval ran, whatever the success rate; 2 for bad input (a missing or
empty task folder, an unknown agent or backend). An unavailable sandbox backend is not
bad input: its trials are recorded as sandbox_error (infrastructure) and the eval exits 0.

What it does not do: store trials in the lake, retry, or resume (see docs/AGENTS.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from rlpipe.agents.evaluation import agent_factory, run_eval
from rlpipe.agents.task_format import builtin_suite_dir, load_tasks
from rlpipe.agents.trial import TrialOptions
from rlpipe.cli.consoles import literal, stdout_console
from rlpipe.cli.sandbox import Backend
from rlpipe.core.errors import ConfigError

console = stdout_console()


def eval_command(
    tasks: Optional[Path] = typer.Option(None, "--tasks", help="A Harbor-format task folder, or a folder of them "
                                         "(default: the built-in suite)."),
    agent: str = typer.Option(..., "--agent", help="The agent: oracle (runs solution/solve.sh) or noop (submits at once)."),
    backend: Backend = typer.Option(Backend.bwrap, "--backend", help="Sandbox backend."),
    workers: int = typer.Option(2, "--workers", help="Trials run at once."),
    command_timeout_s: float = typer.Option(120.0, "--command-timeout-s", help="Longest single bash call (also capped by "
                                            "the task's agent timeout)."),
    json_out: bool = typer.Option(False, "--json", help="Print the metrics and trials as one JSON object."),
) -> None:
    """Run an agent on every task once; print each trial's verdict and the success rate."""
    agent_factory(agent)  # an unknown agent is bad input before any sandbox starts
    if workers < 1:
        raise ConfigError(f"--workers {workers} must be at least 1", hint="e.g. --workers 2")
    loaded = load_tasks(tasks if tasks is not None else builtin_suite_dir())
    report = run_eval(loaded, agent, backend.value, workers, TrialOptions(command_timeout_s=command_timeout_s))
    if json_out:
        trials = [{"task_id": t.task_id, "verdict": t.verdict.value, "family": t.verdict.family, "ending": t.ending.value,
                   "reward": t.reward, "steps": len(t.steps), "duration_s": round(t.duration_s, 3), "detail": t.detail}
                  for t in report.trials]
        typer.echo(json.dumps({"agent": agent, "backend": backend.value, "metrics": report.metrics, "trials": trials}))
        return
    table = Table(title=f"{len(report.trials)} tasks, agent {agent}, backend {backend.value}")
    for column in ("task", "verdict", "reward", "steps", "s", "detail"):
        table.add_column(column)
    for trial in report.trials:
        detail = trial.detail.strip().splitlines()[-1][:70] if trial.detail.strip() else ""
        reward = "" if trial.reward is None else f"{trial.reward:g}"
        table.add_row(trial.task_id, trial.verdict.value, reward, str(len(trial.steps)), f"{trial.duration_s:.2f}", literal(detail))
    console.print(table)
    metrics = report.metrics
    verdicts = ", ".join(f"{name} {count}" for name, count in metrics["verdicts"].items())
    console.print(f"success_rate = {metrics['success_rate']:.3f} ({metrics['passed']}/{metrics['scored']} scored; "
                  f"{metrics['infrastructure_failures']} infrastructure failures, {metrics['not_run']} not run)  verdicts: {verdicts}")
