"""How `rlpipe train` meets ^C and SIGTERM: one orderly path for both.

^C raises KeyboardInterrupt (Python's default). `sigterm_raises` makes SIGTERM raise
`Terminated`, a KeyboardInterrupt that remembers its signal, so a `kill` takes the same
path: Prefect marks the flow run crashed, the flow marks the lake status and the MLflow
run (KILLED), the CLI lets Prefect's workers flush, stops the temporary Prefect server
(orchestration/prefect_server.py), prints one line with the resume command and exits 128 + the
signal's number (130 for SIGINT, 143 for SIGTERM), as shells do.

Inside a flow run Prefect installs its own SIGTERM handler (raising TerminationSignal); on
its way out it restores ours and re-sends the signal, which raises `Terminated` here.

Not here: what a run records (orchestration/status.py), the server (orchestration/prefect_server.py).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like ^C so that every `except KeyboardInterrupt` cleans up for it too."""

    signum = signal.SIGTERM


def exit_code(signal_name: str) -> int:
    """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(signal.Signals[signal_name])


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While inside: SIGTERM raises Terminated in the main thread."""

    def raise_terminated(signum: int, frame: FrameType | None) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is raise_terminated:  # not after hold_signals
            signal.signal(signal.SIGTERM, previous)


def hold_signals() -> None:
    """From now on ignore ^C and SIGTERM: the command is already ending in order (bounded
    waits), and a second ^C must not turn the end into a traceback or an orphan server."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
