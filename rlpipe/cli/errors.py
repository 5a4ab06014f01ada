"""How the CLI reports errors: a short message and hint for rlpipe's own errors (exit 2,
no traceback); anything else is a bug and keeps its traceback."""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import typer
from rich.console import Console

from rlpipe.core.errors import RlpipeError

F = TypeVar("F", bound=Callable)
stderr = Console(stderr=True)


def report_errors(command: F) -> F:
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except RlpipeError as exc:
            stderr.print(f"[bold red]error:[/] {exc.message}")
            if exc.hint:
                stderr.print(f"[yellow]hint:[/] {exc.hint}")
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]
