"""The controller's side of a worker: start it, call it, restart it when it died, stop it.

`WorkerClient` owns one worker process of one kind for one run. The process is
`python -m rlpipe.workers.main`, or a fork of the controller's zygote that runs the same
code with torch and transformers already imported (launch.py says which), in its own
session (a terminal ^C reaches only the controller), bootstrapped on stdin (server.py), and
reached over an AF_UNIX socket in the run's socket folder with a fresh random authkey per
process.

Life and death:
- `start()` spawns without waiting; the first call waits until the worker is ready (its
  model built), so the two workers and the controller's own set-up overlap.
- A call to a worker that died before it read the request (seen by poll(), or by no
  Accepted coming back) starts a fresh one and sends it there, after `on_restart` brought
  its state back (controller/launch.py restores a trainer from the lake and syncs an engine's
  weights). A worker that dies during a call (EOF on the socket)
  makes the call raise EngineFailed, an InfraError that Prefect retries; the retry starts a
  fresh worker.
- A call interrupted in the controller (^C) leaves the socket mid-message: the worker is
  killed at once; the next call starts a fresh one.
- `stop()` asks the worker to exit, waits STOP_GRACE_S, then kills it; `close()` does so for
  good (the run ends): calls after it, or cut by it, raise WorkerClosed. An atexit hook stops
  every worker this process still holds. If the controller itself is killed (kill -9), each
  worker's watchdog sees it and exits (server.py).

A restarted worker gets the controller's environment without RLPIPE_FAILPOINTS: its crash
points would count again from zero (core/failpoints.py).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from rlpipe.core.errors import EngineFailed
from rlpipe.core.failpoints import ENV_VAR as FAILPOINTS_ENV_VAR
from rlpipe.workers import launch
from rlpipe.workers import protocol as p

class WorkerClosed(RuntimeError):
    """A call to a worker the run has stopped (not an InfraError: never retried)."""


READY_TIMEOUT_S = float(os.environ.get("RLPIPE_WORKER_READY_TIMEOUT_S", "900"))
STOP_GRACE_S = 10.0
_LIVE: "weakref.WeakSet[WorkerClient]" = weakref.WeakSet()


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker is started with. `secrets` are the config's excluded fields (S3 keys)."""

    run_id: str
    kind: p.WorkerKind
    config_json: str
    socket_folder: Path
    weights_folder: Path
    secrets: dict[str, str | None] = field(default_factory=dict)
    python: str = sys.executable
    """The worker's interpreter (the engine worker may run in another venv: rollout.engine_python)."""


class WorkerClient:
    """One worker of one run; calls are serialized (a lock), any thread may call."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.on_restart: Callable[[], None] | None = None
        self.handle: p.WorkerHandle | None = None
        self.starts = 0  # processes made ready so far
        self._lock = threading.RLock()
        self._process: subprocess.Popen | launch.ForkedWorker | None = None
        self._connection: Connection | None = None
        self._pending_ready = False
        self.closed = False  # set by close(): the run is ending, no call starts a worker again
        _LIVE.add(self)

    # ---- life -------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the process (if none is alive) without waiting for it to be ready."""
        with self._lock:
            if self._process is not None and self._process.poll() is None:
                return
            self._discard()
            address = str(self.spec.socket_folder / f"{self.spec.kind}-{self.starts}.sock")
            authkey = os.urandom(32)
            env = dict(os.environ)
            if self.starts > 0:
                env.pop(FAILPOINTS_ENV_VAR, None)
            process = launch.launch(self.spec.python, self.spec.kind, self.spec.run_id, env, self)
            boot = dict(run_id=self.spec.run_id, kind=self.spec.kind, address=address, authkey=authkey.hex(),
                        owner_pid=os.getpid(), config_json=self.spec.config_json, secrets=self.spec.secrets,
                        socket_folder=str(self.spec.socket_folder), weights_folder=str(self.spec.weights_folder))
            try:
                process.stdin.write((json.dumps(boot) + "\n").encode())
                process.stdin.close()
            except OSError:
                pass  # it died at once; _wait_ready reports how
            self._process, self._address, self._authkey = process, address, authkey
            self._pending_ready = True

    def _ensure_ready(self) -> None:
        """A live, connected worker; a fresh one (and on_restart) if it died."""
        if self._connection is not None and self._process is not None and self._process.poll() is None:
            return
        restarted = self.starts > 0
        if self._process is None or self._process.poll() is not None or not self._pending_ready:
            self.start()
        try:
            self._wait_ready()
            self._connection = Client(self._address, family="AF_UNIX", authkey=self._authkey)
        except BaseException:
            self._discard()
            raise
        self._pending_ready = False
        self._serving(p.WorkerHandle(self.spec.run_id, self.spec.kind, self._address, self._process.pid), restarted)

    def _serving(self, handle: p.WorkerHandle, restarted: bool) -> None:
        """A worker is up: count it, and after a restart bring it back to the run's state
        (`on_restart`) before it serves, or discard it."""
        self.starts += 1
        self.handle = handle
        if restarted and self.on_restart is not None:
            try:
                self.on_restart()
            except BaseException:
                self._discard()  # not brought back: never serve from a wrong state
                raise

    def _wait_ready(self) -> None:
        process, line, deadline = self._process, b"", time.monotonic() + READY_TIMEOUT_S
        while not line.endswith(b"\n"):
            if time.monotonic() > deadline:
                raise EngineFailed(f"the {self.spec.kind} worker of run {self.spec.run_id} was not ready after {READY_TIMEOUT_S:.0f} s",
                                   hint="raise RLPIPE_WORKER_READY_TIMEOUT_S, or check what the worker printed")
            if select.select([process.stdout], [], [], 0.2)[0]:
                chunk = os.read(process.stdout.fileno(), 65536)
                if chunk:
                    line += chunk
                    continue
            if process.poll() is not None and not select.select([process.stdout], [], [], 0)[0]:
                break
        process.stdout.close()
        message = json.loads(line) if line.strip() else {}
        if "ready" in message:
            return
        if "failed" in message:
            p.raise_failed(p.Failed(**message["failed"]), self.spec.kind, "start-up")
        raise EngineFailed(f"the {self.spec.kind} worker of run {self.spec.run_id} exited during start-up "
                           f"(exit code {process.poll()})", hint="see what it printed above; the stage is retried")

    def _exit_code_soon(self, timeout_s: float = 5.0) -> int | None:
        """The dead worker's exit code: its socket closes a moment before the kernel reaps it."""
        if self._process is None:
            return None
        try:
            return self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None  # alive after all (a broken socket): _discard kills it

    def _discard(self) -> None:
        """Drop the connection and kill the process (if any); the next call starts afresh."""
        connection, process = self._connection, self._process
        self._connection, self._process, self.handle, self._pending_ready = None, None, None, False
        if connection is not None:
            try:
                connection.close()
            except OSError:
                pass
        if process is not None:
            if process.poll() is None:
                _kill_group(process)
            process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None and not stream.closed:
                    stream.close()

    def stop(self) -> None:
        """Ask the worker to exit; kill it after STOP_GRACE_S (or at once if a call is in flight)."""
        if not self._lock.acquire(timeout=1.0):
            process = self._process
            if process is not None and process.poll() is None:
                _kill_group(process)
            return
        try:
            connection, process = self._connection, self._process
            if connection is not None and process is not None and process.poll() is None:
                try:
                    connection.send(p.Stop())
                    for _ in ("Accepted", "Ok"):
                        if connection.poll(STOP_GRACE_S):
                            connection.recv()
                    process.wait(timeout=STOP_GRACE_S)
                except (OSError, EOFError, subprocess.TimeoutExpired):
                    pass
            self._discard()
        finally:
            self._lock.release()

    def close(self) -> None:
        """Stop the worker for good: a call in flight (another thread's) and any later call
        raise WorkerClosed, which no stage retries, instead of starting a fresh worker."""
        self.closed = True
        try:
            self.stop()
        finally:
            launch.release(self)

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    # ---- calls ------------------------------------------------------------------------

    def call(self, request: Any) -> Any:
        """Send one request, return its value (or raise what the worker raised, see protocol.py).

        A worker that dies before it has read the request (no Accepted came back: it was
        killed between two calls and the kernel had not closed its socket yet) never acted
        on it, so the request goes once more to a fresh worker. One that dies after it
        makes the call raise EngineFailed."""
        name = type(request).__name__
        with self._lock:
            for attempt in (1, 2):
                if self.closed:
                    raise WorkerClosed(f"the {self.spec.kind} worker of run {self.spec.run_id} was stopped: the run is ending ({name} not sent)")
                self._ensure_ready()
                accepted = False
                try:
                    self._connection.send(request)
                    accepted = isinstance(self._connection.recv(), p.Accepted)
                    reply = self._connection.recv()
                except (EOFError, OSError) as exc:
                    code = self._exit_code_soon()
                    self._discard()
                    if self.closed:
                        raise WorkerClosed(f"the {self.spec.kind} worker of run {self.spec.run_id} was stopped during {name}: "
                                           "the run is ending") from exc
                    if not accepted and attempt == 1:
                        continue  # never read: the next round starts a fresh worker and sends it again
                    raise EngineFailed(
                        f"the {self.spec.kind} worker of run {self.spec.run_id} died during {name} "
                        f"({type(exc).__name__}; exit code {code})",
                        hint="the stage is retried and starts a fresh worker; if it keeps dying, check its memory and device",
                    ) from exc
                except BaseException:
                    self._discard()  # interrupted mid-message: this worker cannot be trusted any more
                    raise
                break
            if isinstance(reply, p.Failed):
                if self._process is not None:  # a poisoned worker exits after its reply
                    try:
                        self._process.wait(timeout=0.05)
                    except subprocess.TimeoutExpired:
                        pass
                p.raise_failed(reply, self.spec.kind, name)
            return reply.value

    def digest(self) -> str:
        return self.call(p.WeightsDigest())


class EngineClient(WorkerClient):
    def generate(self, prompts: list[tuple[str, str]], params: Any, *, dtype: str | None = None,
                 batch_size: int | None = None) -> p.GenerateResult:
        return self.call(p.Generate(tuple(prompts), params, dtype, batch_size))

    def load_weights_file(self, path: str, policy_version: int) -> int:
        return self.call(p.LoadWeightsFile(path, policy_version))

    def version(self) -> int:
        return self.call(p.EngineVersion())

    def render_chat(self, messages: tuple[tuple[str, str], ...]) -> p.RenderedChat:
        return self.call(p.RenderChat(tuple(messages)))


class TrainerClient(WorkerClient):
    def update(self, step: int, parts: tuple, shuffle_seed: int) -> p.UpdateResult:
        return self.call(p.Update(step, tuple(parts), shuffle_seed))

    def save_checkpoint(self, step: int, config_hash: str) -> None:
        self.call(p.SaveCheckpoint(step, config_hash))

    def restore(self, target_version: int | None, seed: int) -> p.RestoreResult:
        return self.call(p.Restore(target_version, seed))

    def publish_weights(self) -> p.Published:
        return self.call(p.PublishWeights(str(self.spec.weights_folder)))

    def reset_reference(self) -> None:
        self.call(p.ResetReference())

    def warm_start_begin(self, request: p.WarmStartBegin) -> None:
        self.call(request)

    def warm_start_wait(self, timeout_s: float = 1.0) -> p.WarmStartState:
        return self.call(p.WarmStartWait(timeout_s))

    def warm_start_continue(self, stop: bool) -> None:
        self.call(p.WarmStartContinue(stop))


def _kill_group(process: subprocess.Popen | launch.ForkedWorker) -> None:
    """SIGKILL the worker's process group (its own session: the worker and anything it started)."""
    if process.pid is None:
        return  # the zygote died before it forked this worker: nothing to kill
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            process.kill()
        except ProcessLookupError:
            pass


@atexit.register
def _stop_all() -> None:
    for client in list(_LIVE):
        process = client._process
        if process is not None and process.poll() is None:
            _kill_group(process)
