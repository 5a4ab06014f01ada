"""The worker side of the RPC: read the bootstrap, watch the owner, build the service,
listen, answer requests one at a time until Stop, a closed connection, or the owner's death.

Bootstrap: one JSON line on stdin (never argv or the environment: it carries the authkey and
the lake's S3 keys): run id, kind, socket address, authkey (hex), owner pid, the run config
(JSON) and its secret fields, the run's weights folder. Handshake: one JSON line on the
original stdout, `{"ready": pid}` once the service is built and the socket listens, or
`{"failed": {...}}` (protocol.Failed's fields) when building failed; after it stdout is
pointed at stderr so a stray print cannot block the pipe.

Owner death: a watchdog thread polls the owner every WATCH_INTERVAL_S (its parent pid,
`kill(pid, 0)`, and /proc: a zombie or a new process under the owner's pid is no owner; a
worker forked by the zygote has the zygote as parent) and exits the process at once
(os._exit) when the owner is gone, removing the run's socket and weights folders (the dead
owner cannot). PR_SET_PDEATHSIG is not used: it
fires when the spawning *thread* exits, and Prefect runs tasks in threads. ^C at the
terminal does not reach a worker (its own session, SIGINT ignored): the controller decides
when it ends.

Once a worker has waited TRIM_AFTER_IDLE_S for its next request it returns its freed heap
pages to the kernel (`return_freed_memory`): the engine's KV cache and the trainer's
activations are not held while the other worker's long stage runs. Not at once after each
reply: the next request would fault the same pages in again, which cost a 1-s quickstart
step ~0.1 s (docs/RESULTS.md, "The CLI's whole step beside the loop and TRL").

A service may mark itself `poisoned` when a request failed half-way through changing its
state (an update interrupted after some optimizer steps): the worker then exits after the
reply, and the controller's next call starts a fresh worker that restores from the lake.

Not here: what a service computes (engine_worker.py, trainer_worker.py).
"""

from __future__ import annotations

import ctypes
import functools
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict
from multiprocessing.connection import Listener
from collections.abc import Callable
from typing import Any, Protocol

from rlpipe.core import failpoints
from rlpipe.workers.protocol import Accepted, Failed, Ok, Ping, Stop, failed_from

WATCH_INTERVAL_S = 0.2
log = logging.getLogger("rlpipe.workers")


class Service(Protocol):
    """What a worker serves; one that owns processes of its own may also have `close()`,
    called before the worker exits (not when its owner died: the watchdog exits at once)."""

    poisoned: bool

    def handle(self, request: Any) -> Any:
        """The value of one request (raise to fail it)."""
        ...


TRIM_AFTER_IDLE_S = 1.0
"""How long a worker waits for its next request before it returns its freed heap pages."""


def return_freed_memory() -> None:
    """Give the pages of freed heap memory back to the kernel (glibc's malloc_trim(0); a no-op
    where there is none). Tensors of up to 32 MB come from malloc's heap, which keeps what is
    freed for later allocations: without this a worker idles holding its last request's
    activations, KV cache or logits, while the other worker reaches its own peak."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def owner_alive(owner_pid: int, parent_at_start: int, owner_started: str | None = None) -> bool:
    """Whether the owner runs. A worker forked by the zygote (launch.py) is not the owner's
    child: for it a dead owner that its parent has not reaped yet (a zombie) counts as
    gone, and so does a different process under the owner's pid (`owner_started`: its start
    time when the watch began, from /proc)."""
    if parent_at_start == owner_pid and os.getppid() != owner_pid:
        return False  # re-parented: the owner exited (also while it is an unreaped zombie)
    try:
        os.kill(owner_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state, started = proc_stat(owner_pid)
    return state != "Z" and (owner_started is None or started is None or started == owner_started)


def proc_stat(pid: int) -> tuple[str | None, str | None]:
    """(state, start time) of `pid` from /proc (None, None where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None, None
    return fields[0], fields[19] if len(fields) > 19 else None


def start_watchdog(owner_pid: int, folders: list[str]) -> Callable[[float], None]:
    """Start the watchdog thread; returns `exit_if_owner_dies(grace_s)`, which waits up to
    `grace_s` for the owner to be gone (a closed socket comes just before the parent pid
    changes) and then exits as the watchdog does."""
    parent_at_start = os.getppid()
    owner_started = proc_stat(owner_pid)[1]

    def exit_as_orphan() -> None:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        os._exit(0)

    def watch() -> None:
        while owner_alive(owner_pid, parent_at_start, owner_started):
            time.sleep(WATCH_INTERVAL_S)
        exit_as_orphan()

    def exit_if_owner_dies(grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not owner_alive(owner_pid, parent_at_start, owner_started):
                exit_as_orphan()
            time.sleep(WATCH_INTERVAL_S / 4)

    threading.Thread(target=watch, name="owner-watchdog", daemon=True).start()
    return exit_if_owner_dies


def run_worker(build_service) -> None:  # noqa: ANN001 - (kind, run_id, bootstrap) -> Service
    """The whole life of a worker process (called by main.py)."""
    boot = json.loads(sys.stdin.readline())
    handshake = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format=f"[{boot['kind']} worker] %(levelname)s %(message)s")
    owner = int(boot["owner_pid"])
    exit_if_owner_dies = start_watchdog(owner, [boot["socket_folder"], boot["weights_folder"]])
    failpoints.die_with(owner)  # a crash point hit here kills the whole run, as in one process
    try:
        service = build_service(boot)
    except BaseException as exc:  # noqa: BLE001 - reported to the controller, then exit
        handshake.write(json.dumps({"failed": asdict(failed_from(exc, traceback.format_exc()))}) + "\n")
        handshake.flush()
        os._exit(2)
    listener = Listener(boot["address"], family="AF_UNIX", authkey=bytes.fromhex(boot["authkey"]))
    handshake.write(json.dumps({"ready": os.getpid()}) + "\n")
    handshake.flush()
    handshake.close()
    if not serve(listener, service):
        exit_if_owner_dies(2.0)  # the socket closed without Stop: the owner may be dying
    close = getattr(service, "close", None)  # a service with processes of its own (trainer_group.py) ends them
    if close is not None:
        close()
    os._exit(0)


def serve(listener: Listener, service: Service) -> bool:
    """Answer requests on one accepted connection until Stop (returns True) or the
    controller closes it (False)."""
    while True:
        try:
            connection = listener.accept()
            break
        except Exception as exc:  # noqa: BLE001 - a peer without the authkey: wait for ours
            log.warning("refused a connection: %s", exc)
    with connection:
        trim_due = False  # a reply went out since the last trim
        while True:
            try:
                if trim_due and not connection.poll(TRIM_AFTER_IDLE_S):
                    return_freed_memory()  # idle: the other worker's stage is a long one
                trim_due = False
                request = connection.recv()
            except (EOFError, OSError):
                return False  # the controller is done with this worker (or gone)
            try:
                connection.send(Accepted())
            except (EOFError, OSError):
                return False
            if isinstance(request, Stop):
                connection.send(Ok(None))
                return True
            if isinstance(request, Ping):
                connection.send(Ok(os.getpid()))
                continue
            try:
                reply: Ok | Failed = Ok(service.handle(request))
            except Exception as exc:  # noqa: BLE001 - every error goes back to the caller
                reply = failed_from(exc, traceback.format_exc())
            try:
                connection.send(reply)
            except (EOFError, OSError):
                return False
            trim_due = True
            if isinstance(reply, Failed) and service.poisoned:
                log.warning("state changed half-way before %s; exiting so that a fresh worker restores it", reply.error_type)
                return True
