"""How the CLI reports errors: a short message and hint for rlpipe's own errors (exit 2,
no traceback); anything else is a bug and keeps its traceback.

Messages and hints print as one line each (cli/consoles.py: no wrap inside a path, an id or
a URL, at any width) and literally (brackets in a value are not read as markup).

`run_cli` (the `rlpipe` command's entry point) ends the process at once after an error line
(`os._exit(2)`, streams flushed), without the interpreter's teardown: by then every context
manager of the command has unwound, and the native thread pools of Arrow and DuckDB, once
used (a lake read), can abort in that teardown ("terminate called without an active
exception", exit -6 instead of 2; seen in CI). In-process callers (typer's CliRunner) get
typer.Exit(2) as before.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Callable, NoReturn, TypeVar

import typer

from rlpipe.cli.consoles import literal, stderr_console
from rlpipe.core.errors import RlpipeError

F = TypeVar("F", bound=Callable)
USER_ERROR_EXIT_CODE = 2
stderr = stderr_console()


def print_error(exc: RlpipeError) -> None:
    """`error: <message>` and `hint: <hint>` on stderr, one line each."""
    stderr.print(f"[bold red]error:[/] {literal(exc.message)}")
    if exc.hint:
        stderr.print(f"[yellow]hint:[/] {literal(exc.hint)}")


def report_errors(command: F) -> F:
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except RlpipeError as exc:
            print_error(exc)
            raise typer.Exit(USER_ERROR_EXIT_CODE) from None

    return wrapper  # type: ignore[return-value]


def run_cli(app: typer.Typer) -> NoReturn:
    """Run `app` as the process's command; an exit with USER_ERROR_EXIT_CODE ends it at once."""
    try:
        app()
    except SystemExit as exc:
        if exc.code == USER_ERROR_EXIT_CODE:
            exit_now(USER_ERROR_EXIT_CODE)
        raise
    sys.exit(0)


def exit_now(code: int) -> NoReturn:
    """End the process with `code` now, its output flushed (see the module docstring)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
