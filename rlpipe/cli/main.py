"""The `rlpipe` command (typer): parses arguments, then calls flows (train) or, for
read-only commands (runs, query), storage/ directly. Prefect is imported only once the
local services (`rlpipe up`) are known, so `rlpipe train` reports to them unasked.

Only `train` creates a lake; read-only commands and run lookups open it as it is, and a
missing lake is exit 2 naming it. A resumed run keeps its config; only what the config
hash leaves out (train.steps, eval.*, checkpoint.*, sandbox.pool_size, storage, tracking)
may change, and a changed step count is said aloud ("extending run X from 10 to 15 steps")."""

from __future__ import annotations

import json
import logging
import secrets
import time
from pathlib import Path
from typing import Optional

import click
import typer
from typer.core import TyperGroup

from rlpipe.cli import sandbox as sandbox_cli
from rlpipe.cli import services as services_cli
from rlpipe.cli.consoles import literal, stdout_console
from rlpipe.cli.errors import report_errors, run_cli
from rlpipe.cli.eval import eval_command
from rlpipe.cli.eval_replay import replay_command
from rlpipe.cli.export import export as export_command
from rlpipe.cli.lake import config_for_lake, open_lake
from rlpipe.cli.qa import qa as qa_command
from rlpipe.cli.rescore import rescore as rescore_command
from rlpipe.cli.verify import verify as verify_command
from rlpipe.core.config import (
    RunConfig, config_changes, config_from_dict, hash_excluded, hash_excluded_keys, load_config, with_overrides,
)
from rlpipe.core.errors import ConfigError, LakeNotFoundError, RunNotFoundError
from rlpipe.sandbox.docker_owners import reap_in_background

USER_ORDER = ("train", "resume", "runs", "query", "export", "eval", "qa", "rescore", "verify", "sandbox", "up", "down")
"""The order `rlpipe --help` lists the commands in: what a user does first, first."""


class _UserOrderGroup(TyperGroup):
    def list_commands(self, ctx: click.Context) -> list[str]:
        known = [name for name in USER_ORDER if name in self.commands]
        return known + [name for name in self.commands if name not in USER_ORDER]


app = typer.Typer(help="RL post-training with verifiable rewards, as durable Prefect flows.", no_args_is_help=True,
                  cls=_UserOrderGroup)
runs_app = typer.Typer(help="Inspect runs stored in the lake.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")
app.add_typer(sandbox_cli.app, name="sandbox", help="Run commands in a sandbox; check its guarantees.")
app.command("verify", help="Score a JSONL file of completions offline.")(report_errors(verify_command))
eval_app = typer.Typer(invoke_without_command=True, no_args_is_help=False)
eval_app.callback(help="Run an agent on Harbor-format terminal tasks in sandboxes (`rlpipe eval replay --help`: go on "
                  "from a step of a recorded trial).")(report_errors(eval_command))
eval_app.command("replay", help="Restore the state after step K of a recorded trial; continue with another agent.")(
    report_errors(replay_command))
app.add_typer(eval_app, name="eval")
app.command("qa", help="Gate an environment: solvability, verifier consistency, reward-hack probes, difficulty.")(report_errors(qa_command))
app.command("export", help="Write a run's policy at a checkpoint as a Hugging Face model folder.")(report_errors(export_command))
app.command("rescore", help="Re-verify a run's stored trajectories with the current verifiers; print what flipped.")(report_errors(rescore_command))
app.command("up", help="Start a local Prefect server and MLflow UI on loopback.")(report_errors(services_cli.up))
app.command("down", help="Stop what `rlpipe up` started.")(report_errors(services_cli.down))
console = stdout_console()

SET_HELP = "Override a config value: section.key=value (repeatable)."
LAKE_HELP = "Lake URI (folder or s3://bucket/prefix); default: from --config, else ./rlpipe-lake."


def _new_run_id(config_path: Optional[Path]) -> str:
    stem = config_path.stem if config_path else "run"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@app.command()
@report_errors
def train(
    config: Optional[Path] = typer.Argument(None, help="Sparse TOML config (only what differs from defaults)."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Id of the new run (default: generated)."),
    resume: Optional[str] = typer.Option(None, "--resume", help="Resume this run from the lake."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show Prefect's task logs."),
) -> None:
    """Train a policy with GRPO; print the run id, the lake, the MLflow run and held-out accuracy."""
    run_config = load_config(config, set_)
    if resume is not None:
        config_given = config is not None or bool(set_)
        run_id, run_config = resume, _resumed_config(run_config, resume, run_config if config_given else None)
        _stop_if_finished(run_config, run_id)
    else:
        run_id = run_id or _new_run_id(config)
        _refuse_existing(run_config, run_id)
    _run_train(run_config, run_id, verbose)


@app.command()
@report_errors
def resume(
    run_id: str = typer.Argument(..., help="The run to resume."),
    lake: Optional[str] = typer.Option(None, "--lake", help=LAKE_HELP),
    set_: list[str] = typer.Option([], "--set", help="Change what a resume may change, e.g. train.steps=N to extend "
                                   f"the run (only keys left out of the config hash: {hash_excluded_keys()})."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show Prefect's task logs."),
) -> None:
    """Resume a run: replay committed steps from the lake, then go on (to train.steps)."""
    base = config_for_lake(None, lake)
    run_config = _resumed_config(base, run_id, None, set_)
    _stop_if_finished(run_config, run_id)
    _run_train(run_config, run_id, verbose)


def _stop_if_finished(run_config: RunConfig, run_id: str) -> None:
    """A run that finished at train.steps has nothing left to train: say so and exit 0, before
    any worker or server starts (a larger train.steps extends it instead)."""
    from rlpipe.storage.lake_records import RunState

    lake = open_lake(run_config)
    status = lake.read_status(run_id)
    if status is None or status.state != RunState.FINISHED or status.step != run_config.train.steps:
        return
    after = lake.read_json(run_id, "evals/after_rl.json") or {}
    accuracy = f", held-out accuracy {after['accuracy']:.3f}" if isinstance(after.get("accuracy"), (int, float)) else ""
    console.print(f"run {literal(run_id)} already finished at step {status.step} of {run_config.train.steps}{accuracy}: "
                  f"nothing to resume (to train on: rlpipe resume {literal(run_id)} --set train.steps=N, N > {status.step})",
                  soft_wrap=True)
    raise typer.Exit(0)


def _run_train(run_config: RunConfig, run_id: str, verbose: bool) -> None:
    """Run the train flow; on ^C or SIGTERM end in order (see cli/signals.py): one line
    with the resume command, exit 130 or 143, no process left behind."""
    from rlpipe.cli.signals import exit_code, hold_signals, sigterm_raises

    with sigterm_raises():
        try:
            summary = _train(run_config, run_id, verbose)
        except BaseException as exc:
            signal_name = _signal_of(exc)
            if signal_name is None:
                raise
            hold_signals()
        else:
            _print_summary(summary)
            return
    console.print(_interrupted_line(run_config, run_id, signal_name), soft_wrap=True)  # one line, whatever the width
    raise typer.Exit(exit_code(signal_name))


def _train(run_config: RunConfig, run_id: str, verbose: bool):
    from rlpipe.cli.progress import follow_run
    from rlpipe.cli.signals import hold_signals
    from rlpipe.controller.preflight import preflight

    preflight(run_config, run_id)  # bad input fails here, before a flow run or a lake write
    reap_in_background()  # containers a killed eval left (docker_owners.py)
    _export_s3_keys(run_config)
    services_cli.export_service_env(verbose)
    if not verbose:
        _quiet_libraries()
        # MLflow logs a SQLite error with its traceback before raising it; the error itself
        # reaches the flow (which reports it), the traceback would bury the interrupt line.
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    from rlpipe.flows.train import train as train_flow
    from rlpipe.orchestration.prefect_server import temporary_prefect_server

    console.print(f"run [bold]{run_id}[/]  lake [cyan]{run_config.storage.lake_uri}[/]")
    with temporary_prefect_server():  # stopped last, after the flow run has recorded its end
        try:
            with follow_run(run_config, run_id, console):
                return train_flow(run_config, run_id)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt) or _signal_of(exc):
                hold_signals()  # the server's stop and the workers' flush are bounded waits
            raise


def _signal_of(exc: BaseException) -> str | None:
    """"SIGINT"/"SIGTERM" when `exc` is how a signal surfaced (^C's KeyboardInterrupt, the
    CLI's Terminated, Prefect's TerminationSignal, or an error raised from one), else None."""
    import signal
    import sys

    if "prefect" in sys.modules:  # else it cannot be Prefect's, and importing it now is slow
        from rlpipe.orchestration.status import interruption

        return interruption(exc)
    if isinstance(exc, KeyboardInterrupt):
        return signal.Signals(getattr(exc, "signum", signal.SIGINT)).name
    return None


def _interrupted_line(run_config: RunConfig, run_id: str, signal_name: str) -> str:
    """One line: where the run stopped and how to resume it (from the lake's status.json)."""
    from rlpipe.cli.runs import resume_command
    from rlpipe.controller.builders import build_lake

    try:
        lake = build_lake(run_config)
        info, status = lake.read_run_info(run_id), lake.read_status(run_id)
    except Exception:  # noqa: BLE001 - the line must come out even when the lake is gone
        info = status = None
    if info is None:
        return f"[yellow]interrupted ({signal_name})[/] before run {run_id} was created; nothing to resume"
    where = f" at step {status.step} ({status.stage})" if status is not None else ""
    return f"[yellow]interrupted ({signal_name})[/]{where}; resume with: {resume_command(run_id, run_config.storage.lake_uri)}"


def _print_summary(summary) -> None:
    console.print(f"[green]finished[/] run [bold]{summary.run_id}[/]: {summary.steps_committed} steps committed")
    console.print(f"lake:    {summary.lake_uri}")
    console.print(f"mlflow:  {summary.mlflow_run_url or summary.tracking_uri}  run {summary.mlflow_run_id}")
    console.print(f"prefect: {summary.prefect_flow_run_url or _no_prefect_ui(summary.prefect_flow_run_id)}", soft_wrap=True)
    console.print(f"policy:  {summary.final_checkpoint}  (HF model folder)")
    console.print(
        f"held-out accuracy: {summary.accuracy_before_rl:.3f} before RL -> "
        f"[bold]{summary.accuracy_after_rl:.3f}[/] after ({summary.accuracy_after_rl - summary.accuracy_before_rl:+.3f})"
    )
    console.print(f"per domain, strict and format-free with standard errors: rlpipe runs show {literal(summary.run_id)} "
                  f"--lake {literal(summary.lake_uri)}", soft_wrap=True)


def _no_prefect_ui(flow_run_id: str) -> str:
    from rlpipe.cli.progress import no_prefect_ui

    return no_prefect_ui(flow_run_id)


def _export_s3_keys(run_config: RunConfig) -> None:
    """S3 keys from the config reach the flow through the environment only: the config the
    flow gets (a Prefect parameter, run.json, MLflow params) never holds them."""
    import os

    storage = run_config.storage
    if storage.s3_access_key:
        os.environ["AWS_ACCESS_KEY_ID"] = storage.s3_access_key
    if storage.s3_secret_key:
        os.environ["AWS_SECRET_ACCESS_KEY"] = storage.s3_secret_key


def _quiet_libraries() -> None:
    """Keep library chatter (MLflow's INFO lines, transformers' progress bars) off the console.
    The progress bars ("Writing model shards" at each checkpoint) come from the workers, which
    inherit the environment and read it as transformers loads; the controller never imports
    transformers (a second of start-up)."""
    import logging
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name in ("mlflow", "alembic", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _refuse_existing(run_config: RunConfig, run_id: str) -> None:
    try:
        lake = open_lake(run_config)
    except LakeNotFoundError:
        return  # a new lake: the run's pre-flight creates it
    if lake.read_run_info(run_id) is not None:
        raise ConfigError(f"run {run_id!r} already exists in {run_config.storage.lake_uri}", f"resume it with --resume {run_id}, or pick another --run-id")


def _resumed_config(base: RunConfig, run_id: str, given: Optional[RunConfig], overrides: list[str] = ()) -> RunConfig:
    """The config to resume run `run_id` with: the config `given` (`train CONFIG --resume`),
    else the run's stored config with `overrides` applied (`resume RUN --set`); storage from
    `base`. Refused unless it computes what the run computes (same config hash) and keeps
    every committed step; a changed step count (or eval/checkpoint interval) is printed."""
    lake = open_lake(base)
    info = lake.read_run_info(run_id)
    if info is None:
        raise RunNotFoundError(f"no run {run_id!r} in {base.storage.lake_uri}", "list runs with `rlpipe runs list`, or point --lake/--config at the lake that holds it")
    stored = config_from_dict(json.loads(info.config_json))
    if given is None:
        # Without a config (`rlpipe resume RUN --lake X`) the run logs on into the MLflow store it
        # started in, not the embedded default of the current folder (where its MLflow run is missing).
        given = with_overrides(stored.model_copy(update={"storage": base.storage}), list(overrides))
    else:
        given = given.model_copy(update={"storage": base.storage})
    changes = [change for change in config_changes(stored, given) if not change[0].startswith(("storage.", "tracking."))]
    computed = [change for change in changes if not hash_excluded(change[0])]
    if computed:
        listed = ", ".join(f"{key} {old} -> {new}" for key, old, new in computed)
        raise ConfigError(
            f"run {run_id!r} cannot go on with another config: {listed} (config hash {stored.config_hash()} -> {given.config_hash()})",
            f"a resumed run keeps what it computes; only {hash_excluded_keys()} may change. "
            "Resume with the run's own config (`rlpipe resume RUN_ID`), or start a new run",
        )
    committed = lake.committed_steps(run_id)
    if committed and given.train.steps < committed[-1]:
        raise ConfigError(
            f"run {run_id!r} has {committed[-1]} steps committed; train.steps={given.train.steps} would drop some",
            f"pass train.steps >= {committed[-1]} (e.g. --set train.steps={stored.train.steps}), or start a new run",
        )
    if given.train.steps != stored.train.steps:
        verb = "extending" if given.train.steps > stored.train.steps else "shortening"
        console.print(f"{verb} run {literal(run_id)} from {stored.train.steps} to {given.train.steps} steps "
                      f"({len(committed)} committed)")
    for key, old, new in changes:
        if key != "train.steps":
            console.print(f"resuming run {literal(run_id)} with {literal(key)} {literal(old)} -> {literal(new)}")
    return given


@runs_app.command("list")
@report_errors
def runs_list(
    config: Optional[Path] = typer.Option(None, "--config", help="Read the lake location from this config."),
    lake: Optional[str] = typer.Option(None, "--lake", help=LAKE_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the runs in the lake, newest first."""
    from rlpipe.cli.runs import print_runs

    print_runs(open_lake(config_for_lake(config, lake)), json_out, console)


@runs_app.command("show")
@report_errors
def runs_show(
    run_id: str = typer.Argument(..., help="The run to show."),
    config: Optional[Path] = typer.Option(None, "--config", help="Read the lake location from this config."),
    lake: Optional[str] = typer.Option(None, "--lake", help=LAKE_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A run's state, config, steps committed, last metrics, held-out accuracy before/after RL."""
    from rlpipe.cli.runs import print_run

    print_run(open_lake(config_for_lake(config, lake)), run_id, json_out, console)


@app.command()
@report_errors
def query(
    sql: str = typer.Argument(..., help="SQL over the view `trajectories` (committed steps only)."),
    config: Optional[Path] = typer.Option(None, "--config", help="Read the lake location from this config."),
    lake: Optional[str] = typer.Option(None, "--lake", help=LAKE_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print JSON rows."),
    limit: int = typer.Option(1000, "--limit", min=0, help="Print at most this many rows (0: every row); rows are streamed."),
) -> None:
    """Query the trajectories with DuckDB, e.g. "select domain, avg(reward) from trajectories group by 1"."""
    from rlpipe.cli.query_output import print_query

    print_query(open_lake(config_for_lake(config, lake)), sql, json_out, console, limit)


def main() -> None:
    """The `rlpipe` command (pyproject's entry point)."""
    run_cli(app)


if __name__ == "__main__":
    main()
