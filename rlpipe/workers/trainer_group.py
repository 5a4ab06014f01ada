"""The trainer worker as the front of a torchrun group (cluster.trainer_nproc = N > 1): it
starts the group once, relays the controller's requests to its ranks, and watches it.

    controller --RPC--> trainer worker (this service) --AF_UNIX--> rank 0 .. rank N-1
                          |                                         (python -m torch.distributed.run
                          +-- torchrun --standalone ...              --standalone --nproc-per-node N
                                                                     -m rlpipe.workers.trainer_rank)

Why one long-lived group and not torchrun per update: a rank costs a torch import and a
model build (seconds on CPU, a model load on GPU) and the optimizer state would have to
travel in and out at every step; the group lives as long as the trainer worker, so an
update costs only its compute and the all-reduces. Each rank runs the ordinary
TrainerService (workers/trainer_worker.py) with its RankShare; every rank holds the whole
model and optimizer.

Which rank does what: Update and Restore go to every rank (they run collectives; each rank
reads the rows, or the checkpoint, from the lake itself); everything else (weight publishing
and streams, checkpoints, the warm-start, the KL reference reset, digests) to rank 0 alone,
whose lake writes and /dev/shm files are the group's. After a request that may have changed
rank 0's weights alone (the warm-start, a reference reset, ...), the next Update first
copies rank 0's state to every rank (RankCall.sync_first; the first Update does so too).

Failure: a rank that dies, a collective that fails (a peer gone, the process group's timeout
cluster.trainer_timeout_s passed) or a group that does not start raises TrainerGroupFailed
(an InfraError: Prefect retries the stage) and marks this service poisoned, so server.py
ends the worker after its reply; `close` then ends torchrun and the ranks, and the
controller's next call starts a fresh worker and group that restore from the lake. A rank's
own rlpipe error (a ConfigError, LakeCorrupted, ...) is raised again as itself. If this
worker is killed, each rank's watchdog (and a closed socket) ends it, and torchrun with them.

Not here: the data-parallel sums (rl/data_parallel.py), the rank's side (trainer_rank.py).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from rlpipe.core.config import RunConfig
from rlpipe.core.errors import TrainerGroupFailed
from rlpipe.workers import protocol as p
from rlpipe.workers.trainer_rank import GROUP_ENV

log = logging.getLogger("rlpipe.workers.trainer_group")
EVERY_RANK = (p.Update, p.Restore)
READ_ONLY = (p.PublishWeights, p.BeginWeightStream, p.PublishWeightChunk, p.SaveCheckpoint, p.WeightsDigest)
POLL_S = 0.2
FAILED_PEERS_GRACE_S = 10.0  # after one rank failed, how long the others may take to answer
STOP_GRACE_S = 5.0


class TrainerGroupService:
    """A Service (server.py) whose work is done by the ranks of a torchrun group."""

    def __init__(self, boot: dict, config: RunConfig) -> None:
        self.poisoned = False
        self.nproc = config.cluster.trainer_nproc
        self._dirty = True  # rank 0's state may differ from the others' (before the first update: rebuilt alike, synced once)
        folder = Path(boot["socket_folder"])
        authkey = os.urandom(32)
        address = str(folder / f"trainer-group-{os.getpid()}.sock")
        self._listener = Listener(address, family="AF_UNIX", authkey=authkey)
        self._spec_path = folder / f"trainer-group-{os.getpid()}.json"
        descriptor = os.open(self._spec_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as spec:
            json.dump({"address": address, "authkey": authkey.hex(), "owner_pid": os.getpid()}, spec)
        self._launcher = subprocess.Popen(launch_command(self.nproc), env=_rank_environment(self._spec_path, self.nproc))
        self._ranks: list[tuple[int, Connection]] = []  # (pid, connection) by rank
        try:
            self._start(boot, config.cluster.trainer_timeout_s)
        except BaseException:
            self.close()
            raise

    def handle(self, request: Any) -> Any:
        if isinstance(request, EVERY_RANK):
            call = p.RankCall(request, sync_first=self._dirty and isinstance(request, p.Update))
            value = self._call(range(self.nproc), call)
            if isinstance(request, p.Update) or value.checkpoint_step is not None:
                self._dirty = False  # every rank did the same update, or loaded the same checkpoint
            return value
        if not isinstance(request, READ_ONLY):
            self._dirty = True
        return self._call([0], p.RankCall(request))

    def close(self) -> None:
        """End the group: Stop to every rank, then torchrun (SIGTERM: it ends its ranks), then
        SIGKILL for whatever is left; removes the socket and spec files."""
        for _, connection in self._ranks:
            try:
                connection.send(p.Stop())
            except OSError:
                pass
        if self._launcher.poll() is None:
            try:
                self._launcher.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self._launcher.send_signal(signal.SIGTERM)
                try:
                    self._launcher.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    self._launcher.kill()
                    self._launcher.wait()
        for pid, _ in self._ranks:  # each rank is in a session of its own (torchrun's)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._listener.close()
        self._spec_path.unlink(missing_ok=True)

    def _start(self, boot: dict, timeout_s: float) -> None:
        """Accept every rank's connection, send it the bootstrap, wait for it to be built."""
        accepted: queue.Queue = queue.Queue()

        def accept() -> None:
            for _ in range(self.nproc):
                try:
                    accepted.put(self._listener.accept())
                except OSError as exc:  # the listener closed, or a peer without the authkey
                    accepted.put(exc)
                    return

        threading.Thread(target=accept, name="trainer-group-accept", daemon=True).start()
        deadline = time.monotonic() + timeout_s
        hellos: dict[int, tuple[int, Connection]] = {}
        while len(hellos) < self.nproc:
            self._check_launcher("start-up")
            if time.monotonic() > deadline:
                raise TrainerGroupFailed(f"{len(hellos)} of {self.nproc} trainer ranks connected within {timeout_s:.0f} s",
                                         "raise cluster.trainer_timeout_s, or read the trainer worker's log for torchrun's errors")
            try:
                connection = accepted.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if isinstance(connection, BaseException):
                raise TrainerGroupFailed(f"the trainer group's socket failed: {connection}") from connection
            try:
                hello = connection.recv()
            except (EOFError, OSError):
                self._fail("a trainer rank died before it said its rank")
            hellos[hello.rank] = (hello.pid, connection)
        self._ranks = [hellos[rank] for rank in range(self.nproc)]
        for _, connection in self._ranks:
            connection.send(boot)
        self._collect(range(self.nproc), "start-up", deadline)

    def _call(self, ranks: Any, call: p.RankCall) -> Any:
        for rank in ranks:
            try:
                self._ranks[rank][1].send(call)
            except OSError as exc:
                self._fail(f"rank {rank} of the trainer group is gone ({exc}) before {type(call.request).__name__}")
        return self._collect(ranks, type(call.request).__name__, None)

    def _collect(self, ranks: Any, name: str, deadline: float | None) -> Any:
        """Every rank's reply; the lowest rank's value (rank 0's). Raises what a rank raised (TrainerGroupFailed for a
        machinery fault), after its peers answered or FAILED_PEERS_GRACE_S passed."""
        pending = {rank: self._ranks[rank][1] for rank in ranks}
        replies: dict[int, p.RankReply] = {}
        failed_at: float | None = None
        while pending:
            self._check_launcher(name)
            now = time.monotonic()
            if deadline is not None and now > deadline:
                self._fail(f"trainer ranks {sorted(pending)} did not answer {name} in time")
            if failed_at is not None and now - failed_at > FAILED_PEERS_GRACE_S:
                self.poisoned = True  # the others wait in a collective for the failed one
                break
            for rank, connection in list(pending.items()):
                try:
                    if not connection.poll(POLL_S / len(pending)):
                        continue
                    replies[rank] = connection.recv()
                except (EOFError, OSError):
                    self._fail(f"rank {rank} of the trainer group died during {name}")
                del pending[rank]
                self.poisoned = self.poisoned or replies[rank].poisoned
                if isinstance(replies[rank].reply, p.Failed) and failed_at is None:
                    failed_at = time.monotonic()
        for rank in sorted(replies):
            reply = replies[rank].reply
            if isinstance(reply, p.Failed):
                if pending or self.poisoned:
                    self.poisoned = True  # rebuilt from the lake: the ranks may differ now
                self._raise(rank, name, reply)
        return replies[min(replies)].reply.value  # rank 0's, when it was asked

    def _raise(self, rank: int, name: str, failed: p.Failed) -> None:
        if failed.infra:
            raise TrainerGroupFailed(f"rank {rank} of the trainer group failed in {name}: {failed.error_type}: {failed.message}",
                                     "the stage is retried on a fresh group; if it keeps failing, read the trainer worker's log")
        p.raise_failed(failed, f"trainer (rank {rank})", name)

    def _check_launcher(self, name: str) -> None:
        code = self._launcher.poll()
        if code is not None:
            self._fail(f"torchrun of the trainer group exited with status {code} during {name} (a rank died)")

    def _fail(self, message: str) -> None:
        self.poisoned = True
        raise TrainerGroupFailed(message, "the stage is retried on a fresh group; if it keeps failing, read the trainer worker's log")


def launch_command(nproc: int) -> list[str]:
    """torchrun (torch.distributed.run, in this interpreter) with `nproc` ranks on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", f"--nproc-per-node={nproc}",
            "--max-restarts=0", "--monitor-interval=0.2", "-m", "rlpipe.workers.trainer_rank"]


def _rank_environment(spec_path: Path, nproc: int) -> dict[str, str]:
    """The worker's environment plus the group's spec file; the CPU threads split between the
    ranks (torchrun's default is 1 each) unless OMP_NUM_THREADS is set; gloo on loopback
    (one machine) unless GLOO_SOCKET_IFNAME is set."""
    environment = {**os.environ, GROUP_ENV: str(spec_path)}
    environment.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    environment.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return environment
