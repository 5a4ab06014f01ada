"""How the controller starts a worker process: forked from its zygote (default), or spawned
as `python -m rlpipe.workers.main` (another interpreter, or RLPIPE_WORKER_LAUNCH=spawn).

A spawned worker imports torch and transformers itself, ~4.5 s of CPU per start on a small
machine. The zygote (zygote.py) imports them once per controller and forks each worker from
that state, so a run's two workers and every restart after a death pay no import. Both paths
give a worker the same things: its own session, the bootstrap on stdin and the handshake on
stdout (server.py), the controller's stderr, and the controller's environment as it is at the
launch (`env`, without RLPIPE_FAILPOINTS for a restart: client.py decides).

The zygote is one process per controller, in its own session, started lazily by the first
launch with the controller's environment of that moment. A launch whose environment differs
from the zygote's in anything but RLPIPE_FAILPOINTS (a variable that torch, transformers or
libgomp may have read at import) gets a fresh zygote; the old one exits and leaves the
workers it forked running. The zygote ends when the last client that used it is closed
(`release`: the run ended), when the controller dies (it watches its owner), or at exit.

A shared zygote (RLPIPE_ZYGOTE_SOCKET: the path of its AF_UNIX socket, `start_shared_zygote`)
serves many controllers, each connected once: a launch whose environment has the variable
forks its worker there when the zygote's hello says it imported under the launch's
`import_settings` (zygote.py: the environment less its run-scoped variables, so runs that
differ only in PREFECT_HOME, RLPIPE_FAILPOINTS, COLUMNS and such share it). Otherwise (other
settings, no zygote at that path, a connection that broke) the launch takes the controller's
own zygote as above. The test session starts one (tests/conftest.py), so the suite's CLI runs
import torch and transformers twice in all instead of once each.

A zygote-forked worker is not the controller's child: `ForkedWorker` gives the part of
subprocess.Popen that client.py uses (pid, poll, wait, kill, stdin, stdout), fed by the
status pipe on which the zygote writes the pid and, once it reaped the worker, its exit code.

Not here: the bootstrap, calls, restarts and stop (client.py).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref

from rlpipe.core.failpoints import ENV_VAR as FAILPOINTS_ENV_VAR
from rlpipe.workers.server import proc_stat

LAUNCH_ENV_VAR = "RLPIPE_WORKER_LAUNCH"
"""`zygote` (the default) or `spawn`: every worker a fresh interpreter, as before the zygote."""
SHARED_ZYGOTE_ENV_VAR = "RLPIPE_ZYGOTE_SOCKET"
"""The AF_UNIX socket path of a shared zygote to fork workers from, where its settings fit."""
HELLO_TIMEOUT_S = 300.0  # a shared zygote just started may still be importing (minutes on a loaded box)
UNKNOWN_EXIT = 255  # the zygote died before it could report the worker's exit code
_LOG = logging.getLogger(__name__)


def uses_zygote(python: str) -> bool:
    """Whether a worker for interpreter `python` is forked from the zygote."""
    mode = os.environ.get(LAUNCH_ENV_VAR, "zygote").strip().lower()
    if mode not in ("zygote", "spawn"):
        from rlpipe.core.errors import ConfigError

        raise ConfigError(f"{LAUNCH_ENV_VAR}={mode!r} is not a launch mode", hint="use zygote (the default) or spawn")
    return mode == "zygote" and _same_interpreter(python)


def launch(python: str, kind: str, run_id: str, env: dict[str, str], user: object) -> "subprocess.Popen | ForkedWorker":
    """Start the worker process (not waiting for it to be ready). `user` (a client) keeps
    the zygote alive until `release(user)`."""
    if not uses_zygote(python):
        return subprocess.Popen(
            [python, "-m", "rlpipe.workers.main", "--kind", kind, "--run-id", run_id],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True,
        )
    with _LOCK:
        _USERS.add(user)
        shared = _shared_for(env)
        if shared is not None:
            try:
                return shared.fork(kind, run_id, env)
            except OSError:  # the shared zygote went away: this controller's own serves from now on
                _drop_shared()
        try:
            return _zygote_for(env).fork(kind, run_id, env)
        except OSError:  # it died between the check and the request: once more, with a fresh one
            _retire()
            return _zygote_for(env).fork(kind, run_id, env)


def release(user: object) -> None:
    """`user` will launch no more workers; the zygote ends when no user is left."""
    global _ZYGOTE
    with _LOCK:
        _USERS.discard(user)
        if not _USERS:
            _drop_shared()
            if _ZYGOTE is not None:
                _ZYGOTE.close(wait_s=2.0)
                _ZYGOTE = None


def start_shared_zygote(path: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a shared zygote listening on `path` (AF_UNIX: at most 107 bytes), owned by this
    process (it exits when this process does, or on SIGTERM), importing under `env` (this
    process's environment by default). The socket is bound here, so a controller may connect
    at once; it waits for the hello while the zygote imports."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(64)
        return subprocess.Popen(
            [sys.executable, "-m", "rlpipe.workers.zygote", "--listen", str(listener.fileno()), path, str(os.getpid())],
            pass_fds=[listener.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )
    finally:
        listener.close()


def shared_zygote_pid() -> int | None:
    """The pid of the shared zygote this process is connected to (tests)."""
    shared = _SHARED
    return shared.pid if shared is not None else None


def zygote_pid() -> int | None:
    """The running zygote's pid (tests, benchmarks)."""
    zygote = _ZYGOTE
    return zygote.process.pid if zygote is not None and zygote.process.poll() is None else None


class ForkedWorker:
    """A worker forked by the zygote, seen from the controller (a subset of Popen)."""

    def __init__(self, stdin: int, stdout: int, status: int) -> None:
        self.stdin = os.fdopen(stdin, "wb")
        self.stdout = os.fdopen(stdout, "rb")
        self.returncode: int | None = None
        self._status: int | None = status
        self._received = b""
        self._pid: int | None = None

    @property
    def pid(self) -> int | None:
        """The worker's pid (waits for the zygote's fork: it may still be importing)."""
        while self._pid is None and self._status is not None:
            self._read_status(None)
        return self._pid

    def poll(self) -> int | None:
        self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("rlpipe worker", timeout)
            self._read_status(0.1 if left is None else min(0.1, left))
        return self.returncode

    def kill(self) -> None:
        pid = self.pid
        if pid is not None and self.poll() is None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _read_status(self, timeout: float | None) -> None:
        """Read what the zygote wrote (pid, then exit code) within `timeout`."""
        if self._status is None:
            if self.returncode is None and self._pid is not None and not _alive(self._pid):
                self.returncode = UNKNOWN_EXIT  # the zygote died; the worker is gone now
            elif timeout:
                time.sleep(min(timeout, 0.1))
            return
        if not select.select([self._status], [], [], timeout)[0]:
            return
        chunk = os.read(self._status, 16 - len(self._received))
        self._received += chunk
        if len(self._received) >= 8 and self._pid is None:
            self._pid = int.from_bytes(self._received[:8], sys.byteorder, signed=True)
        if len(self._received) == 16:
            self.returncode = int.from_bytes(self._received[8:], sys.byteorder, signed=True)
        if not chunk or self.returncode is not None:
            os.close(self._status)
            self._status = None
            if self._pid is None:
                self.returncode = UNKNOWN_EXIT  # never forked: the zygote died first
            elif self.returncode is None and not _alive(self._pid):
                self.returncode = UNKNOWN_EXIT


class _SharedZygote:
    """This controller's connection to a shared zygote, and what its hello said."""

    def __init__(self, path: str) -> None:
        from rlpipe.workers.zygote import read_hello

        self.path = path
        self.control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.control.settimeout(HELLO_TIMEOUT_S)
            self.control.connect(path)
            hello = read_hello(self.control)
            self.control.settimeout(None)
        except (OSError, ValueError):
            self.control.close()
            raise
        self.settings: dict[str, str] = hello["settings"]
        self.pid: int = hello["pid"]

    def fork(self, kind: str, run_id: str, env: dict[str, str]) -> ForkedWorker:
        return _fork(self.control, kind, run_id, env)

    def close(self) -> None:
        self.control.close()


class _Zygote:
    """The controller's end of one zygote process."""

    def __init__(self, env: dict[str, str]) -> None:
        self.fingerprint = _fingerprint(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rlpipe.workers.zygote", str(theirs.fileno()), str(os.getpid())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
                start_new_session=True,
            )
        finally:
            theirs.close()
        self.control = ours

    def fork(self, kind: str, run_id: str, env: dict[str, str]) -> ForkedWorker:
        return _fork(self.control, kind, run_id, env)

    def close(self, wait_s: float = 0.0) -> None:
        """Close its socket: it exits once done importing (the workers it forked keep
        running until stopped). With `wait_s`, wait that long for it, then kill it."""
        self.control.close()
        if wait_s > 0:
            try:
                self.process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _fork(control: socket.socket, kind: str, run_id: str, env: dict[str, str]) -> ForkedWorker:
    """Ask the zygote at the other end of `control` for a worker."""
    from rlpipe.workers.zygote import send_request

    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        send_request(control, {"kind": kind, "run_id": run_id, "env": env, "cwd": os.getcwd(), "umask": _umask()},
                     [stdin_r, stdout_w, 2, status_w])
    except OSError:
        for fd in (stdin_w, stdout_r, status_r):
            os.close(fd)
        raise
    finally:
        for fd in (stdin_r, stdout_w, status_w):
            os.close(fd)
    return ForkedWorker(stdin_w, stdout_r, status_r)


_LOCK = threading.Lock()
_USERS: "weakref.WeakSet[object]" = weakref.WeakSet()  # clients that may launch again
_ZYGOTE: _Zygote | None = None
_SHARED: _SharedZygote | None = None


def _shared_for(env: dict[str, str]) -> _SharedZygote | None:
    """The shared zygote that `env` names, connected, if it imported under env's settings."""
    global _SHARED
    from rlpipe.workers.zygote import import_settings

    path = env.get(SHARED_ZYGOTE_ENV_VAR, "").strip()
    if not path:
        return None
    if _SHARED is not None and _SHARED.path != path:
        _drop_shared()
    if _SHARED is None:
        try:
            _SHARED = _SharedZygote(path)
        except (OSError, ValueError):
            return None  # none there (a stale variable): this controller's own zygote serves
    settings = import_settings(env)
    if _SHARED.settings == settings:
        return _SHARED
    if _LOG.isEnabledFor(logging.DEBUG):
        differ = sorted(key for key in settings.keys() | _SHARED.settings.keys() if settings.get(key) != _SHARED.settings.get(key))
        _LOG.debug("the shared zygote imported under other settings (%s): this controller's own zygote serves", differ)
    return None


def _drop_shared() -> None:
    global _SHARED
    if _SHARED is not None:
        _SHARED.close()
        _SHARED = None


def _retire() -> None:
    global _ZYGOTE
    if _ZYGOTE is not None:
        _ZYGOTE.close()
        _ZYGOTE = None


def _zygote_for(env: dict[str, str]) -> _Zygote:
    global _ZYGOTE
    zygote = _ZYGOTE
    if zygote is not None and (zygote.process.poll() is not None or zygote.fingerprint != _fingerprint(env)):
        zygote.close()  # not waited for: it may be importing still; subprocess reaps it later
        zygote = None
    if zygote is None:
        zygote = _ZYGOTE = _Zygote(env)
    return zygote


def _fingerprint(env: dict[str, str]) -> frozenset:
    return frozenset((key, value) for key, value in env.items() if key != FAILPOINTS_ENV_VAR)


def _umask() -> int | None:
    """This process's umask, from /proc (os.umask would set it for every thread a moment)."""
    try:
        with open("/proc/self/status") as status:
            return next((int(line.split()[1], 8) for line in status if line.startswith("Umask:")), None)
    except OSError:
        return None


def _same_interpreter(python: str) -> bool:
    """Path equality without resolving links: another venv's python links to the same binary."""
    return os.path.abspath(python) == os.path.abspath(sys.executable)


def _alive(pid: int) -> bool:
    """Running, not a zombie (server.py reads /proc the same way for the owner watchdog)."""
    return proc_stat(pid)[0] not in (None, "Z")
