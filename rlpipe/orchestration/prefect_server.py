"""The Prefect API one `rlpipe train` process reports to, and its orderly end.

With PREFECT_API_URL set (`rlpipe up`, a test harness, a remote server) there is nothing
to start. Without it Prefect runs a temporary server (its "ephemeral mode"): Prefect's own
SubprocessASGIServer spawns uvicorn in the CLI's process group, so a ^C on the terminal
reaches the server too; it dies before the flow run has recorded its end, and the flow
then retries its API calls for minutes ("Error logging to API", ConnectError). A SIGTERM
used to kill the CLI through Prefect's own SIGTERM bridge, skipping the atexit hook that
stops the server: an orphan.

`temporary_prefect_server` starts the same temporary server (the same uvicorn app and
settings as Prefect's) in its own session, so terminal signals reach only the CLI, with
the kernel's parent-death signal set, so it cannot outlive the CLI even when the CLI is
SIGKILLed. It registers it as Prefect's default temporary server (as Prefect's test
harness does), so every client in the process uses it. On the way out it lets Prefect's
log and event workers send what they hold, then stops the server: last.

Not here: catching signals (cli/signals.py), what a run records when interrupted
(flows/train.py, orchestration/status.py).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import prefect
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED, get_current_settings

STARTUP_TIMEOUT_S = float(os.environ.get("RLPIPE_SERVICE_STARTUP_TIMEOUT_S", "300"))  # a hang guard; Prefect's 20 s is too short on a loaded 2-core box
DRAIN_TIMEOUT_S = 10.0
PR_SET_PDEATHSIG = 1


def reread_prefect_settings() -> None:
    """Prefect's settings and logging configuration, read again from the environment as it
    is now (Prefect reads them when imported; refresh_global_settings_context is its own call
    for environment changes after that)."""
    from prefect.context import refresh_global_settings_context
    from prefect.logging.configuration import setup_logging

    refresh_global_settings_context()
    setup_logging(incremental=False)


@cache
def detached_server_class() -> type[Any]:
    """`DetachedTemporaryServer`, defined on first use: its base class lives in
    prefect.server.api.server, which imports Prefect's whole API server (~2.4 s of CPU), and
    a run that reports to a running server (PREFECT_API_URL) never needs it."""
    from prefect.server.api.server import SubprocessASGIServer

    class DetachedTemporaryServer(SubprocessASGIServer):
        """Prefect's temporary API server, in its own session and tied to this process's life."""

        def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
            # The command and environment of SubprocessASGIServer._run_uvicorn_command
            # (prefect 3.9), plus start_new_session and the parent-death signal.
            server_env = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
            return subprocess.Popen(
                args=[
                    sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent),
                    "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
                    "--port", str(self.port), "--log-level", "error", "--lifespan", "on",
                ],
                env={**os.environ, **server_env, **get_current_settings().to_environment_variables(exclude_unset=True)},
                start_new_session=True,
                preexec_fn=_die_with_parent(),
            )

    return DetachedTemporaryServer


def _die_with_parent() -> Any:
    """A preexec_fn (Linux) that asks the kernel to SIGTERM the child when this process
    dies. Everything it needs is looked up here, before the fork."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody would stop us
            os._exit(1)

    return preexec


def uses_temporary_server() -> bool:
    return not PREFECT_API_URL.value() and bool(PREFECT_SERVER_EPHEMERAL_ENABLED.value())


@contextmanager
def temporary_prefect_server() -> Iterator[str | None]:
    """Start the detached temporary server when Prefect would start one (no
    PREFECT_API_URL); yield its API URL (None when an API is configured). On exit, drain
    Prefect's log and event workers, then stop the server (also after an interrupt)."""
    server, ours = None, False
    try:
        if uses_temporary_server():
            server_class = detached_server_class()
            server = server_class._instances.get(None)  # SubprocessASGIServer's registry
            if server is None or not server.running:  # else someone else's (a test harness): theirs to stop
                server_class._instances.pop(None, None)
                server, ours = server_class(), True
                server.start(timeout=STARTUP_TIMEOUT_S)  # a ^C while it starts still stops it below
        yield None if server is None else server.api_url
    finally:
        drain_prefect_workers()
        if ours:
            server.stop()


def drain_prefect_workers() -> None:
    """Let the log and event workers send what they hold (bounded), so nothing is left to
    send to a server about to stop."""
    for worker in (APILogWorker, EventsWorker):
        try:
            worker.drain_all(timeout=DRAIN_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a worker that never started, or a dead server
            pass
