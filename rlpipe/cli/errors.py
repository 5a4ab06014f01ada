"""How the CLI reports errors: a short message and hint for rlpipe's own errors (exit 2,
no traceback); anything else is a bug and keeps its traceback.

Messages and hints print as one line each (cli/consoles.py: no wrap inside a path, an id or
a URL, at any width) and literally (brackets in a value are not read as markup).
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

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
