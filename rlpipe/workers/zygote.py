"""The zygote: a process that imports torch, transformers and the worker services once,
then forks each worker of the controllers it serves from that state.

`python -m rlpipe.workers.zygote FD OWNER_PID` (started by launch.py, in its own session):
a controller's own zygote. It imports PRELOAD, then serves fork requests on the AF_UNIX
socket FD, and exits when the controller closes its end.

`python -m rlpipe.workers.zygote --listen FD PATH OWNER_PID` (launch.start_shared_zygote;
`serve_listening`, also the tests' CLI zygote's loop: tests/helpers/cli_zygote.py): a shared
zygote that serves every controller which connects to the AF_UNIX socket PATH, listening on
FD (bound by its starter, so nobody connects too early) (the test session starts one;
RLPIPE_ZYGOTE_SOCKET tells controllers where it is). On each
connection it first sends a hello (`import_settings` of the environment it imported under,
and its pid), then serves that connection's fork requests; it lives until its owner dies
or it is sent SIGTERM, and removes PATH then.

A request on either kind of connection is one
length-prefixed JSON record (kind, run id, the controller's environment, working folder and
umask at that moment) with four file descriptors attached (SCM_RIGHTS): the worker's stdin (the
bootstrap pipe), its stdout (the handshake pipe), its stderr (the controller's fd 2) and a
status pipe. On the status pipe the zygote writes the child's pid (8 bytes, signed), and
once it has reaped the child, its exit code as subprocess reports it (-9: SIGKILL).

The forked child becomes what `python -m rlpipe.workers.main` is: a new session (a terminal
^C reaches only the controller; the controller kills the worker's group), fds 0/1/2 from
the request, `os.environ` replaced by the controller's environment of the request (so a
restarted worker runs without RLPIPE_FAILPOINTS, core/failpoints.py reads it at each hit),
torch's intra-op threads set from OMP_NUM_THREADS when that is set (libgomp read it when the
zygote imported torch), then server.run_worker. The bootstrap and the handshake are those of
a spawned worker (server.py); the owner watchdog watches the controller, not the zygote.

After the imports the zygote moves every object to the collector's permanent generation
(gc.freeze): a child's garbage collections then never write the flags of the objects it
inherited, so their pages stay shared with the zygote and the other workers instead of being
copied into each worker on its first collection.

`sys.path[0]` becomes the request's working folder where it was the zygote's own (what
`python -m` gives a spawned worker).

A controller's zygote exits when the controller closes its socket or dies (its own
watchdog); no zygote kills a worker, and each leaves the workers it forked running (they
watch their owner, the controller).

`import_settings(env)`: the part of an environment that may shape what an import did, that
is all of it but the run-scoped variables (RUN_SCOPED_PREFIXES, RUN_SCOPED_NAMES: Prefect's,
MLflow's, S3's, pytest's and rlpipe's own, the terminal size, proxies, the shell's PWD,
polars' allocator settings),
which no module of PRELOAD reads at import (tests/workers/test_shared_zygote.py checks).
Two environments with equal settings may share a zygote.

Not here: which launch path a worker takes and the controller's side (launch.py). CUDA is
never initialised here (only imported): a fork after CUDA init breaks the child.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import selectors
import signal
import socket
import struct
import sys
import threading
from collections.abc import Callable

PRELOAD = ("torch", "transformers", "transformers.models.qwen2.modeling_qwen2", "rlpipe.workers.main",
           "rlpipe.workers.builders", "rlpipe.workers.engine_worker", "rlpipe.engines.hf", "rlpipe.rl.trainer",
           "rlpipe.rl.warmstart", "rlpipe.rl.checkpoint")
"""Imported before the first fork. A module that fails to import here is imported (and its
error reported) by the worker that needs it, as a spawned worker would. Not pyarrow (the
lake, trainer_worker.py): loading libarrow starts jemalloc's background thread, and a
process should fork with no thread but the forking one that may hold a lock; the trainer
worker imports it itself (~0.2 s)."""

SIGNED = struct.Struct("q")
HEADER = struct.Struct("!I")
MAX_FDS = 4
OWNER_POLL_S = 0.5
RUN_SCOPED_PREFIXES = ("PREFECT_", "MLFLOW_", "AWS_", "PYTEST_", "RLPIPE_")
RUN_SCOPED_NAMES = frozenset({"COLUMNS", "LINES", "NO_PROXY", "no_proxy", "PWD", "OLDPWD", "_", "_RJEM_MALLOC_CONF"})
"""_RJEM_MALLOC_CONF: polars' jemalloc reads it when polars loads, which PRELOAD never does
(the test checks); polars appends to it at each import, so a process started by one that
imported polars has it twice."""
_START_CWD = os.getcwd()


def import_settings(env: dict[str, str]) -> dict[str, str]:
    """The variables of `env` that a zygote's imports may have read (module docstring)."""
    return {key: value for key, value in env.items()
            if key not in RUN_SCOPED_NAMES and not key.startswith(RUN_SCOPED_PREFIXES)}


def main() -> None:
    if sys.argv[1] == "--listen":
        return serve_listening(sys.argv[2:], PRELOAD, _child)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from rlpipe.workers.server import owner_alive

    parent_at_start = os.getppid()
    control_fd, owner_pid = int(sys.argv[1]), int(sys.argv[2])
    control = socket.socket(fileno=control_fd)
    _preload(lambda: owner_alive(owner_pid, parent_at_start) and not _closed(control))
    _serve(owner_pid, parent_at_start, None, [control])


Child = Callable[[dict, list[int], list[int]], int]
"""What a forked child does with a request (its record, its four fds, the zygote's fds to
close); returns the exit code the child ends with (os._exit)."""


def serve_listening(argv: list[str], preload: tuple[str, ...], child: Child) -> None:
    """A shared zygote's life (`argv`: FD PATH OWNER_PID): import `preload`, then fork `child`
    for each request on the socket PATH (listening on FD) until the owner dies or SIGTERM
    comes; PATH is removed then. Also the tests' CLI zygote (tests/helpers/cli_zygote.py)."""
    from rlpipe.workers.server import owner_alive

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent_at_start = os.getppid()
    listener, path, owner_pid = socket.socket(fileno=int(argv[0])), argv[1], int(argv[2])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    hello = {"settings": import_settings(dict(os.environ)), "pid": os.getpid()}  # before an import adds any
    try:
        _preload(lambda: owner_alive(owner_pid, parent_at_start), preload)
        _serve(owner_pid, parent_at_start, (listener, hello), [], child)
    finally:
        listener.close()
        _unlink(path)  # a forked child never gets here: it ends in os._exit


def _serve(owner_pid: int, parent_at_start: int, listening: tuple[socket.socket, dict] | None,
           connections: list[socket.socket], child: Child | None = None) -> None:
    """Fork a worker for each request until the owner dies, or (a controller's own zygote,
    nothing `listening`) its one connection closes."""
    from rlpipe.workers.server import owner_alive

    listener = listening[0] if listening is not None else None

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    status_of: dict[int, int] = {}  # child pid -> write end of its status pipe
    selector = selectors.DefaultSelector()
    for connection in connections:
        selector.register(connection, selectors.EVENT_READ)
    if listener is not None:
        selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while owner_alive(owner_pid, parent_at_start):
        for key, _ in selector.select(OWNER_POLL_S):
            if key.fileobj is wake_r:
                _drain(wake_r)
                _reap(status_of)
                continue
            if key.fileobj is listener:
                _accept(listening, selector, connections)
                continue
            connection = key.fileobj
            try:
                request = _receive(connection)
            except (OSError, RuntimeError, ValueError):
                request = None  # a broken request: that controller gets no more workers here
            if request is None:
                if listener is None:
                    return  # the controller closed its end: no more workers
                selector.unregister(connection)
                connections.remove(connection)
                connection.close()
                continue
            message, fds = request
            inherited = [selector.fileno(), wake_r, wake_w, *status_of.values(), *(c.fileno() for c in connections)]
            pid = os.fork()
            if pid == 0:
                if listener is not None:
                    inherited.append(listener.fileno())
                os._exit((child or _child)(message, fds, inherited))
            for fd in fds[:3]:
                os.close(fd)
            _write_signed(fds[3], pid)
            status_of[pid] = fds[3]
        _reap(status_of)


def _accept(listening: tuple[socket.socket, dict], selector: selectors.BaseSelector,
            connections: list[socket.socket]) -> None:
    """A new controller: send the hello (the settings this zygote imported under, its pid)."""
    listener, hello = listening
    try:
        connection, _ = listener.accept()
        body = json.dumps(hello).encode()
        connection.sendall(HEADER.pack(len(body)) + body)
    except OSError:
        return
    connections.append(connection)
    selector.register(connection, selectors.EVENT_READ)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _preload(wanted: Callable[[], bool], names: tuple[str, ...] = PRELOAD) -> None:
    """Import `names`; exit at once if the controller dies or closes the socket meanwhile
    (a thread watches, and is gone before the first fork)."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(OWNER_POLL_S):
            if not wanted():
                os._exit(0)

    watcher = threading.Thread(target=watch, name="zygote-watch", daemon=True)
    watcher.start()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the worker imports it again and reports why
            pass
    done.set()
    watcher.join()
    gc.collect()
    gc.freeze()  # see the module docstring: a child's collections never write the imported objects' pages


def _closed(control: socket.socket) -> bool:
    """Whether the controller closed its end (EOF; a pending request is not EOF)."""
    if not select.select([control], [], [], 0)[0]:
        return False
    try:
        return control.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def take_request(message: dict, fds: list[int], inherited: list[int]) -> None:
    """A forked child's first steps: the zygote's signal handlers and fds undone; stdio,
    environment, folder, umask and sys.path[0] (where it was the zygote's) the request's."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for fd in inherited + [fds[3]]:
        os.close(fd)
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(message["env"])
    os.chdir(message["cwd"])
    if message.get("umask") is not None:
        os.umask(message["umask"])
    if sys.path and sys.path[0] == _START_CWD:
        sys.path[0] = message["cwd"]


def _child(message: dict, fds: list[int], inherited: list[int]) -> int:
    """The worker's life, in the forked child."""
    code = 1
    try:
        os.setsid()
        take_request(message, fds, inherited)
        sys.argv = ["rlpipe.workers.main", "--kind", message["kind"], "--run-id", message["run_id"]]
        _name_process(f"rlpipe-{message['kind']}")
        _apply_thread_counts()
        _reseed()
        from rlpipe.workers import main as worker_main

        worker_main.main()  # ends in os._exit
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - printed to the controller's stderr, then exit
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _apply_thread_counts() -> None:
    """What OMP_NUM_THREADS would have done in a fresh process: libgomp read it when the
    zygote imported torch, so the child sets torch's intra-op threads itself."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        import torch

        torch.set_num_threads(int(value))


def _reseed() -> None:
    """Fresh entropy for numpy's global generator, as a new process gets (CPython reseeds
    `random` after a fork itself; torch's default generator starts from a fixed seed in
    every process anyway)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _name_process(name: str) -> None:
    """Shown by ps -o comm and top (the command line stays the zygote's)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _receive(control: socket.socket) -> tuple[dict, list[int]] | None:
    """One request (its record and fds), or None at EOF."""
    data, fds, _, _ = socket.recv_fds(control, HEADER.size, MAX_FDS)
    if not data:
        return None
    while len(data) < HEADER.size:
        more = control.recv(HEADER.size - len(data))
        if not more:
            return None
        data += more
    (length,) = HEADER.unpack(data)
    body = b""
    while len(body) < length:
        more = control.recv(min(1 << 20, length - len(body)))
        if not more:
            return None
        body += more
    if len(fds) != MAX_FDS:
        for fd in fds:
            os.close(fd)
        raise RuntimeError(f"a fork request came with {len(fds)} file descriptors, not {MAX_FDS}")
    return json.loads(body), fds


def send_request(control: socket.socket, message: dict, fds: list[int]) -> None:
    """The controller's side of _receive (launch.py)."""
    body = json.dumps(message).encode()
    socket.send_fds(control, [HEADER.pack(len(body))], fds)
    control.sendall(body)


def read_hello(connection: socket.socket) -> dict:
    """The controller's side of _accept: the shared zygote's settings and pid."""
    data = b""
    while len(data) < HEADER.size:
        more = connection.recv(HEADER.size - len(data))
        if not more:
            raise ConnectionError("the shared zygote closed the connection before its hello")
        data += more
    (length,) = HEADER.unpack(data)
    body = b""
    while len(body) < length:
        more = connection.recv(length - len(body))
        if not more:
            raise ConnectionError("the shared zygote closed the connection during its hello")
        body += more
    return json.loads(body)


def _reap(status_of: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = status_of.pop(pid, None)
        if fd is not None:
            try:
                _write_signed(fd, os.waitstatus_to_exitcode(status))
            except OSError:
                pass  # the controller closed its end
            os.close(fd)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _write_signed(fd: int, value: int) -> None:
    try:
        os.write(fd, SIGNED.pack(value))
    except BrokenPipeError:
        pass


if __name__ == "__main__":
    main()
