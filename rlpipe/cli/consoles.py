"""The consoles every `rlpipe` command prints through, built in one place with one rule.

Rich wraps text at the console's width (the terminal's, COLUMNS, or 80 in a pipe or CI), and
a wrap can fall inside a path, a run id or a URL of a message: it then no longer reads, copies
or greps as one piece. These consoles soft-wrap: every printed message is one line, whatever
the width, and the terminal folds it for the eye only. Tables and progress bars still fit the
width. `literal` escapes text that Rich would otherwise read as markup ("[model]" vanishes).

What it does not: decide what is printed, or where errors go (cli/errors.py prints them).
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape


def stdout_console() -> Console:
    """The console of a command's results (stdout)."""
    return Console(soft_wrap=True)


def stderr_console() -> Console:
    """The console of errors, hints and progress (stderr)."""
    return Console(stderr=True, soft_wrap=True)


def literal(text: object) -> str:
    """`text` as Rich markup that prints exactly `text` (brackets and all)."""
    return escape(str(text))
