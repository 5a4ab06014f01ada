"""The tests' `rlpipe` commands, forked from an interpreter that has imported the CLI once.

A CLI test runs `python -m rlpipe.cli.main ARGS` in a subprocess. A fresh interpreter spends
~4.5 s of CPU importing what `rlpipe train`, `resume` and `eval` need (Prefect, MLflow and its
pandas, polars, scipy and matplotlib, pyarrow, the controller), and the suite runs ~90 such
commands. `run_rlpipe_command` runs the same command in a child forked from a "CLI zygote",
a process (one per pytest process and import settings) that imported PRELOAD once: the child
becomes what `python -m rlpipe.cli.main ARGS` is (runpy runs the module as __main__ with
sys.argv as -m sets it), with the request's environment, working folder, umask and stdio
(pipes read here, as subprocess.run(capture_output=True) reads them), the signal handlers of
a fresh interpreter, its own process group, and Python's own end: non-daemon threads joined,
atexit handlers run. It returns the subprocess.CompletedProcess that subprocess.run would.

The parts of a fresh start that a fork does not redo, and how the child redoes them:
- Prefect reads its settings from the environment at import: the child has Prefect read them
  again (orchestration/prefect_server.py `reread_prefect_settings`: Prefect's own call for environment changes,
  then its logging set up again), as the CLI does itself after it set PREFECT_API_URL and
  such, so PREFECT_HOME, PREFECT_API_URL and the logging levels are the request's. `import
  rlpipe` sets its environment defaults (rlpipe/__init__.py); the child sets them again.
- Every other variable a module of PRELOAD may read at import is in `import_settings`
  (rlpipe/workers/zygote.py: all but the run-scoped ones) or in KEYED: a request whose values
  of these differ from every running CLI zygote's gets one of its own.
  tests/cli/test_cli_zygote.py checks that PRELOAD's imports read no other run-scoped variable
  by name (REREAD aside).

The server side is rlpipe/workers/zygote.py's `serve_listening` (the shared worker zygote's
loop: a hello, then one fork per request, fds passed with SCM_RIGHTS) with this module's
PRELOAD and `_cli_child`. `RLPIPE_TEST_CLI_ZYGOTE=0` turns it off (every command a fresh
interpreter, as before). Tests of what only a fresh process shows (the interpreter's own
start-up, a console script) call subprocess themselves.

What it does not: Popen-style access to a running command (kill tests start the command
with subprocess.Popen), a terminal (stdin is a pipe: `input`, then its end).
"""

from __future__ import annotations

import atexit
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import rlpipe
from rlpipe.workers.launch import ForkedWorker
from rlpipe.workers.zygote import import_settings, read_hello, send_request, serve_listening, take_request

PRELOAD = ("typer", "rich.progress", "rich.table", "matplotlib.figure", "rlpipe.core.config", "rlpipe.flows.train",
           "rlpipe.flows.eval", "rlpipe.agents.evaluation", "rlpipe.storage.evals", "rlpipe.storage.query",
           "rlpipe.storage.run_lock", "rlpipe.controller.builders", "rlpipe.controller.preflight",
           "rlpipe.orchestration.prefect_server", "rlpipe.orchestration.status", "rlpipe.sandbox.docker_owners",
           "mlflow.store.tracking.sqlalchemy_store", "sqlalchemy.dialects.sqlite", "prefect.flow_engine",
           "prefect.task_engine", "prefect.utilities.visualization", "docker")
"""What `rlpipe train`, `resume` and `eval` import (their run's curve plot included) but the CLI's
own modules (rlpipe/cli/): those build consoles at import, whose width (COLUMNS) and colours
are the command's, so each child imports them itself (~0.1 s). Among them what they import only
when they run: MLflow's SQLite store (SQLAlchemy and alembic, the most of what a forked command
still imported; docs/RESULTS.md, "The test suite's time"), imported when the run's tracker opens
its store, Prefect's flow and task engines (at the first flow call) and the docker SDK (the
reaper of a run's containers)."""
KEYED = ("MLFLOW_CONFIGURE_LOGGING", "MLFLOW_DISABLE_AGENT_HINT", "MLFLOW_DISABLE_TELEMETRY",
         "MLFLOW_LOGGING_CONFIGURE_LOGGING", "MLFLOW_LOGGING_LEVEL", "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY",
         "RLPIPE_RETRY_BACKOFF_S", "RLPIPE_SERVICE_STARTUP_TIMEOUT_S", "RLPIPE_WORKER_READY_TIMEOUT_S")
"""Run-scoped variables (not in `import_settings`) that PRELOAD's imports read by name and that
nothing reads again in the child: a request whose values differ gets a zygote of its own."""
REREAD = ("PREFECT_", "COLUMNS", "LINES")
"""Read at import and again in the child: Prefect's settings, and the console of Prefect's log
handler (built again with its logging)."""
MODULE = "rlpipe.cli.main"
SWITCH = "RLPIPE_TEST_CLI_ZYGOTE"
_LOCK = threading.Lock()


class _CliZygote:
    """One CLI zygote process and this process's connection to it."""

    def __init__(self, env: dict[str, str]) -> None:
        folder = tempfile.mkdtemp(prefix="rlpipe-cli-zygote-")
        atexit.register(_remove_folder, folder, os.getpid())  # its socket and log: nothing left in /tmp
        self.path = os.path.join(folder, "socket")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.path)
            listener.listen(16)
            with open(os.path.join(folder, "stderr.log"), "wb") as log:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "tests.helpers.cli_zygote", "--listen", str(listener.fileno()), self.path,
                     str(os.getpid())],
                    pass_fds=[listener.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                    env=env, cwd=folder, start_new_session=True,
                )
        finally:
            listener.close()
        self.control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.control.settimeout(600)
        self.control.connect(self.path)
        self.settings = read_hello(self.control)["settings"]
        self.control.settimeout(None)

    def alive(self) -> bool:
        return self.process.poll() is None


_ZYGOTES: dict[frozenset, _CliZygote] = {}


def _remove_folder(folder: str, creator: int) -> None:
    """At the exit of the process that made `folder` (not of a fork that inherited the handler)."""
    if os.getpid() == creator:
        shutil.rmtree(folder, ignore_errors=True)


def run_rlpipe_command(args: list[str], env: dict[str, str], cwd: Path | str, timeout_s: float,
                       input: str | None = None) -> subprocess.CompletedProcess[str]:
    """`subprocess.run([python, -m, rlpipe.cli.main, *args], env=env, cwd=cwd,
    capture_output=True, text=True, timeout=timeout_s, input=input)`, forked from a CLI zygote."""
    command = [sys.executable, "-m", MODULE, *args]
    if os.environ.get(SWITCH, "1") == "0":
        return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                              input=input, stdin=None if input is not None else subprocess.DEVNULL)
    message = {"args": args, "env": env, "cwd": str(cwd), "umask": _umask()}
    try:
        child, err_r = _request(_zygote_for(env), message)
    except OSError:  # that zygote is gone (killed, or its socket broke): once more, with a fresh one
        child, err_r = _request(_zygote_for(env, retire=True), message)
    outputs = [_Reader(child.stdout), _Reader(os.fdopen(err_r, "rb"))]
    if input is not None:
        child.stdin.write(input.encode())
    child.stdin.close()
    try:
        code = child.wait(timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        raise subprocess.TimeoutExpired(command, timeout_s) from None
    finally:
        for reader in outputs:
            reader.join()  # EOF once the command and whatever inherited its stdio are gone
    stdout, stderr = (reader.text() for reader in outputs)
    return subprocess.CompletedProcess(command, code, stdout, stderr)


class _Reader(threading.Thread):
    """Reads one pipe to its end (as Popen.communicate's threads do)."""

    def __init__(self, pipe) -> None:
        super().__init__(daemon=True)
        self.pipe, self.data = pipe, b""
        self.start()

    def run(self) -> None:
        with self.pipe:
            self.data = self.pipe.read()

    def text(self) -> str:
        return self.data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")  # text=True's newlines


def _request(zygote: _CliZygote, message: dict) -> tuple[ForkedWorker, int]:
    """Send one fork request: the child (pid, exit code, its stdin and stdout) and its stderr."""
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        with _LOCK:
            send_request(zygote.control, message, [stdin_r, out_w, err_w, status_w])
    except OSError:
        for fd in (stdin_w, out_r, err_r, status_r):
            os.close(fd)
        raise
    finally:
        for fd in (stdin_r, out_w, err_w, status_w):
            os.close(fd)
    return ForkedWorker(stdin_w, out_r, status_r), err_r


def zygote_environment(env: dict[str, str]) -> dict[str, str]:
    """What a CLI zygote imports under for a request with `env` (and what tells zygotes apart)."""
    return {**import_settings(env), **{name: env[name] for name in KEYED if name in env}}


def _zygote_for(env: dict[str, str], retire: bool = False) -> _CliZygote:
    settings = zygote_environment(env)
    key = frozenset(settings.items())
    with _LOCK:
        zygote = _ZYGOTES.get(key)
        if zygote is not None and retire:
            zygote.process.kill()
            zygote.process.wait()
            zygote.control.close()
        if zygote is None or not zygote.alive():
            zygote = _ZYGOTES[key] = _CliZygote(settings)
        return zygote


def _umask() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))


def _cli_child(message: dict, fds: list[int], inherited: list[int]) -> int:
    """`python -m rlpipe.cli.main ARGS` in the forked child (the module docstring)."""
    code = 1
    try:
        os.setpgid(0, 0)
        take_request(message, fds, inherited)  # its folder becomes sys.path[0], as -m puts it
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for name, value in rlpipe.ENVIRONMENT_DEFAULTS:  # what `import rlpipe` sets
            os.environ.setdefault(name, value)
        if "prefect.context" in sys.modules:
            from rlpipe.orchestration.prefect_server import reread_prefect_settings

            reread_prefect_settings()
        sys.argv = [MODULE, *message["args"]]
        try:
            runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught error
            import traceback

            traceback.print_exc()
        threading._shutdown()  # what the interpreter's end does: join non-daemon threads,
        atexit._run_exitfuncs()  # then run the atexit handlers
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    return code


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    serve_listening(sys.argv[2:], PRELOAD, _cli_child)
