"""The help a user reads: every help text whole (Rich reads `[model]` as a markup tag and
drops it: "a run config TOML whose  and  tables", so a bracketed word must be escaped), and
the commands in the order a user needs them."""

from __future__ import annotations

import re

import typer.main

from rlpipe.cli.main import app

BRACKETED_WORD = re.compile(r"(?<!\\)\[[a-z][a-z_./ -]*\]")


def _helps(command, path: str):
    yield path, command.help or ""
    for param in getattr(command, "params", []):
        yield f"{path} {'/'.join(getattr(param, 'opts', []))}", getattr(param, "help", None) or ""
    for name, sub in getattr(command, "commands", {}).items():
        yield from _helps(sub, f"{path} {name}")


def test_no_help_text_holds_a_bracketed_word_that_rich_would_swallow():
    swallowed = [f"{where}: {match}" for where, text in _helps(typer.main.get_command(app), "rlpipe")
                 for match in BRACKETED_WORD.findall(text)]
    assert not swallowed, swallowed


def test_the_commands_are_listed_in_the_order_a_user_needs_them():
    """`rlpipe --help` lists what a user does first, first (train, resume, runs, query, ...),
    and every command exactly once."""
    from rlpipe.cli.main import USER_ORDER

    command = typer.main.get_command(app)
    listed = command.list_commands(None)
    assert listed[:len(USER_ORDER)] == list(USER_ORDER)
    assert sorted(listed) == sorted(command.commands)
