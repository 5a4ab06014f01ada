"""`rlpipe sandbox run|selftest`: run one command in a sandbox, or check which guarantees hold here.

Talks to sandbox/ directly (no flow, no Prefect). The docker backend is imported only when
asked for, so `--backend bwrap` works where the docker SDK or engine is missing.

`sandbox run` exits with the command's own status, so scripts can use it like the command;
what the sandbox did to the command has its own codes (RUN_EXIT_CODES, like coreutils
`timeout` and `docker run`): 124 timed out, 137 killed for memory, 125 the sandbox failed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from enum import Enum

import typer
from rich.table import Table

from rlpipe.cli.consoles import stdout_console
from rlpipe.cli.errors import print_error, report_errors
from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox import backends
from rlpipe.sandbox.base import ExecResult, Limits, Sandbox

app = typer.Typer(help="Run commands in a sandbox; check its guarantees.", no_args_is_help=True)
console = stdout_console()


EXIT_TIMEOUT = 124  # like coreutils `timeout`
EXIT_SANDBOX_FAILED = 125  # like `docker run`: the sandbox could not run the command or lost its status
EXIT_OOM = 137  # 128 + SIGKILL: what a shell reports for a process the OOM killer ended
RUN_EXIT_CODES = (
    "Exit status: the command's own (0-255); 124 if it ran past --timeout-s; 137 if it was killed for "
    "using more than --memory-mb; 125 if the sandbox failed (backend unavailable, or the command was "
    "killed without a status); 2 for bad arguments."
)


class Backend(str, Enum):
    bwrap = "bwrap"
    docker = "docker"


def sandbox_factory(backend: Backend) -> Callable[[Limits], Sandbox]:
    """A `limits -> Sandbox` constructor for the backend (imports it only now)."""
    return backends.sandbox_constructor(backend.value)


def run_exit_code(result: ExecResult) -> int:
    """The exit status of `sandbox run` for what the command did (see RUN_EXIT_CODES)."""
    if result.timed_out:
        return EXIT_TIMEOUT
    if result.oom_killed:
        return EXIT_OOM
    if result.exit_code is None:
        return EXIT_SANDBOX_FAILED
    return result.exit_code


@app.command("run", help="Run COMMAND in a fresh sandbox and print what it did (exit code, output, limits hit).\n\n"
             + RUN_EXIT_CODES)
@report_errors
def run(
    command: list[str] = typer.Argument(..., help="The command and its arguments (put them after `--`)."),
    backend: Backend = typer.Option(Backend.bwrap, "--backend", help="Isolation backend."),
    timeout_s: float = typer.Option(10.0, "--timeout-s", help="Wall-clock limit in seconds."),
    memory_mb: int = typer.Option(512, "--memory-mb", help="Memory limit in MiB."),
    network: bool = typer.Option(False, "--network", help="Allow network access (off by default)."),
    as_json: bool = typer.Option(False, "--json", help="Print the ExecResult as JSON."),
) -> None:
    limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb, network=network)
    try:
        sandbox = sandbox_factory(backend)(limits)
        try:
            result = sandbox.exec(list(command))
        finally:
            sandbox.close()
    except SandboxUnavailable as exc:
        print_error(exc)
        raise typer.Exit(EXIT_SANDBOX_FAILED) from None
    if as_json:
        typer.echo(json.dumps(dataclasses.asdict(result)))
    else:
        console.print(_result_table(result))
    raise typer.Exit(run_exit_code(result))


def _result_table(result: ExecResult) -> Table:
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    exit_text = "killed" if result.exit_code is None else str(result.exit_code)
    table.add_row("exit code", exit_text)
    table.add_row("duration", f"{result.duration_s:.3f} s")
    table.add_row("timed out", _flag(result.timed_out))
    table.add_row("oom killed", _flag(result.oom_killed))
    table.add_row("stdout" + (" (truncated)" if result.stdout_truncated else ""), result.stdout.rstrip("\n"), end_section=True)
    table.add_row("stderr" + (" (truncated)" if result.stderr_truncated else ""), result.stderr.rstrip("\n"))
    return table


def _flag(value: bool) -> str:
    return "[red]yes[/]" if value else "no"


class AttackPath(str, Enum):
    exec = "exec"
    exec_python = "exec_python"
    both = "both"


@app.command("selftest")
@report_errors
def selftest(
    backend: Backend = typer.Option(Backend.bwrap, "--backend", help="Isolation backend to attack."),
    path: AttackPath = typer.Option(AttackPath.both, "--path", help="How attack programs run: a plain exec, "
                                    "exec_python (the warm path code verification uses) or both."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcomes as JSON."),
) -> None:
    """Run the attack suite on this host and print which guarantees hold (exit 1 if any does not)."""
    from rlpipe.sandbox.selftest import ATTACKS, PATHS, run_attack

    paths = list(PATHS) if path is AttackPath.both else [path.value]
    factory = sandbox_factory(backend)
    probe = factory(Limits())  # fail fast, with the backend's own hint, if it cannot start at all
    enforcement = probe.enforcement() if hasattr(probe, "enforcement") else ""
    probe.close()
    reaped = reap_leaked(backend)
    outcomes = {}
    with console.status("attacking...") as status:
        for attack in ATTACKS:
            for name in paths:
                status.update(f"attack: {attack.guarantee} ({name})")
                outcomes[attack.guarantee, name] = run_attack(attack, factory, name)
    if as_json:
        typer.echo(json.dumps([{**dataclasses.asdict(outcome), "path": name} for (_, name), outcome in outcomes.items()]))
    else:
        table = Table(title=f"sandbox guarantees on this host ({backend.value})")
        for column in ("guarantee", *(f"held ({name})" for name in paths), "what was tried", "detail"):
            table.add_column(column, overflow="fold")
        for attack in ATTACKS:
            held = ["[green]yes[/]" if outcomes[attack.guarantee, name].held else "[bold red]NO[/]" for name in paths]
            failed = [outcomes[attack.guarantee, name] for name in paths if not outcomes[attack.guarantee, name].held]
            table.add_row(attack.guarantee, *held, attack.description, (failed or [outcomes[attack.guarantee, paths[0]]])[0].detail)
        console.print(table)
        if enforcement:
            console.print(f"enforced by: {enforcement}")
        if reaped:
            console.print(f"reaped {reaped} sandbox(es) leaked by earlier processes")
    if not all(outcome.held for outcome in outcomes.values()):
        raise typer.Exit(1)


def reap_leaked(backend: Backend) -> int:
    """Remove sandboxes that dead processes of this host left behind; how many."""
    return backends.reap_leaked(backend.value)
