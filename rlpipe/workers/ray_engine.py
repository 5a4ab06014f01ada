"""The rollout engine as a Ray actor: `RayEngineClient`, an EngineClient whose worker is an
actor on a Ray cluster (`cluster.engine_on_ray` with `cluster.ray_address`).

The actor (`EngineActor`) hosts the engine worker's own service, engine_worker.EngineService,
built from the run config as the local worker builds it: the same requests (protocol.py), the
same replies, the same errors (an rlpipe error comes back as itself, a RuntimeError/OSError as
EngineFailed, anything else as RemoteError), the same poisoning. Only the transport differs:

- calls are actor method calls (`handle`), one at a time (the client's lock; the actor runs
  one call at a time as well), instead of pickles on an AF_UNIX socket;
- a request that names a weight file (LoadWeightChunk of the chunked sync, LoadWeightsFile of
  async runs and non-hf engines) is sent with the file's bytes, which travel through Ray's
  object store to whichever node holds the actor; the actor writes them to a scratch folder
  of its own on that node and the service loads that path. The controller deletes its file
  once sent (a chunk's file is deleted by the engine in the local worker: here by both ends),
  so /dev/shm stays the trainer's node-local hand-off and nothing assumes a shared disk.

Life and death, as client.py's worker:
- `start()` connects to the cluster (once per process; a connection made earlier, by the
  verifier pool, is reused) and creates the actor without waiting; the first call waits
  until its engine is built (`info`), at most RLPIPE_WORKER_READY_TIMEOUT_S. A cluster that
  lacks the CPUs/GPUs asked for is a ConfigError at once (Ray would keep it pending forever).
- An actor that dies (ray.kill, its node lost, its process killed) makes the call raise
  EngineFailed (an InfraError: the stage is retried). Ray cannot tell whether a dead actor
  had begun the call, so it is never resent; the retried stage's first call creates a fresh
  actor and `on_restart` syncs its weights (controller/launch.py, weight_sync.py: from the trainer, restored
  from the lake if it died too), exactly as for a fresh local worker.
- A call that fails after half-changing the weights (poisoned, engine_worker.py) makes the
  client kill the actor after the reply, so the next call gets a fresh, fully synced one.
- The controller's death: the actor is owned by the controller's Ray driver, and Ray ends an
  owner's actors when its driver exits or dies (kill -9 included).
- `stop()` removes the actor's scratch folder and kills it (a killed actor's folder is removed
  by the next engine actor that starts on its node); `close()` does so for good (later
  calls raise WorkerClosed) and disconnects if this client connected.

Not here: what the engine computes (engine_worker.py), when weights change (tasks/). Ray is
imported only here, lazily: the main venv has no ray (`make venv-ray`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpipe.core.errors import ConfigError, EngineFailed
from rlpipe.workers import protocol as p
from rlpipe.workers.client import READY_TIMEOUT_S, EngineClient, WorkerClosed, WorkerSpec

STOP_GRACE_S = 10.0
SCRATCH_PREFIX = "rlpipe-ray-engine-"
FILE_REQUESTS = (p.LoadWeightChunk, p.LoadWeightsFile)


@dataclass(frozen=True)
class EngineActorInfo:
    """Where the engine actor runs; `failed` when building its engine failed."""

    host: str
    node_id: str
    actor_id: str
    pid: int
    failed: p.Failed | None = None


@dataclass(frozen=True)
class ActorReply:
    reply: p.Ok | p.Failed
    poisoned: bool  # the weights changed half-way: the client kills this actor after the reply


class EngineActor:
    """The body of the Ray actor: engine_worker.EngineService on the actor's node."""

    def __init__(self, run_id: str, config_json: str, secrets: dict[str, str | None], cpus: float) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        _remove_orphaned_scratch()
        self.scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
        self.service: Any = None
        self.failed: p.Failed | None = None
        try:
            from rlpipe.workers.builders import config_from_bootstrap
            from rlpipe.workers.engine_worker import EngineService

            import torch

            torch.set_num_threads(max(1, int(cpus)))  # the CPUs Ray reserved for this actor
            config = config_from_bootstrap({"config_json": config_json, "secrets": secrets})
            self.service = EngineService(run_id, config, str(self.scratch))
        except Exception as exc:  # noqa: BLE001 - reported by info(), raised in the controller as the local handshake does
            self.failed = p.failed_from(exc, traceback.format_exc())

    def info(self) -> EngineActorInfo:
        import ray  # inside an actor: ray is there

        context = ray.get_runtime_context()
        return EngineActorInfo(socket.gethostname(), context.get_node_id(), context.get_actor_id(), os.getpid(), self.failed)

    def handle(self, request: Any, payload: bytes | None = None) -> ActorReply:
        local = None
        try:
            if payload is not None:  # a weight file from the controller's node: written here, its path swapped
                local = self.scratch / f"{type(request).__name__}-{os.urandom(6).hex()}.safetensors"
                local.write_bytes(payload)
                request = dataclasses.replace(request, path=str(local))
            reply: p.Ok | p.Failed = p.Ok(self.service.handle(request))
        except Exception as exc:  # noqa: BLE001 - every error goes back to the caller
            reply = p.failed_from(exc, traceback.format_exc())
        finally:
            if local is not None:
                local.unlink(missing_ok=True)
        return ActorReply(reply, isinstance(reply, p.Failed) and bool(self.service.poisoned))

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def _remove_orphaned_scratch() -> None:
    """Remove the scratch folders of engine actors on this node whose process is gone (a killed
    actor cannot remove its own; they are named rlpipe-ray-engine-<pid>-*)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*-*"):
        pid = folder.name.removeprefix(SCRATCH_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


class RayEngineClient(EngineClient):
    """EngineClient (client.py) whose worker is an EngineActor on the Ray cluster at `address`."""

    def __init__(self, spec: WorkerSpec, address: str, *, num_cpus: float = 1.0, num_gpus: float = 0.0) -> None:
        super().__init__(spec)
        from rlpipe.sandbox.ray_pool import import_ray

        self.ray = import_ray()
        self.address, self.num_cpus, self.num_gpus = address, num_cpus, num_gpus
        self.info: EngineActorInfo | None = None
        self._actor: Any = None
        self._info_ref: Any = None
        self._connected_here = False

    # ---- life -------------------------------------------------------------------------

    def start(self) -> None:
        """Connect and create the actor (if there is none) without waiting for its engine."""
        with self._lock:
            if self._actor is not None:
                return
            self._connect()
            self._check_resources()
            remote_class = self.ray.remote(EngineActor).options(num_cpus=self.num_cpus, num_gpus=self.num_gpus,
                                                                max_restarts=0, max_concurrency=1)
            self._actor = remote_class.remote(self.spec.run_id, self.spec.config_json, self.spec.secrets, self.num_cpus)
            self._info_ref = self._actor.info.remote()

    def _ensure_ready(self) -> None:
        if self._actor is not None and self.info is not None:
            return
        restarted = self.starts > 0
        self.start()
        try:
            info: EngineActorInfo = self._get(self._info_ref, "start-up", timeout_s=READY_TIMEOUT_S)
            if info.failed is not None:
                p.raise_failed(info.failed, self.spec.kind, "start-up")
        except BaseException:
            self._discard()
            raise
        self.info = info
        self._serving(p.WorkerHandle(self.spec.run_id, self.spec.kind, f"ray-actor:{info.actor_id}", info.pid), restarted)

    def _discard(self) -> None:
        """Kill the actor (if any); the next call creates a fresh one."""
        actor, self._actor, self._info_ref, self.info, self.handle = self._actor, None, None, None, None
        if actor is not None:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - an actor already gone, a connection already closed
                pass

    def stop(self) -> None:
        """Remove the actor's scratch folder, then kill it (at once if a call is in flight)."""
        if not self._lock.acquire(timeout=1.0):
            actor = self._actor
            if actor is not None:
                try:
                    self.ray.kill(actor, no_restart=True)
                except Exception:  # noqa: BLE001 - gone already
                    pass
            return
        try:
            if self._actor is not None:
                try:
                    self.ray.get(self._actor.close.remote(), timeout=STOP_GRACE_S)
                except Exception:  # noqa: BLE001 - dead or slow: killed below either way
                    pass
            self._discard()
        finally:
            self._lock.release()

    def close(self) -> None:
        self.closed = True
        try:
            self.stop()
        finally:
            if self._connected_here and self.ray.is_initialized():
                self.ray.shutdown()
                self._connected_here = False

    @property
    def pid(self) -> int | None:
        """The actor's pid on its node (which may not be this machine)."""
        return self.info.pid if self.info is not None else None

    # ---- calls ------------------------------------------------------------------------

    def call(self, request: Any) -> Any:
        """Send one request to the actor, return its value or raise what it raised (client.py)."""
        name = type(request).__name__
        with self._lock:
            if self.closed:
                raise WorkerClosed(f"the engine actor of run {self.spec.run_id} was stopped: the run is ending ({name} not sent)")
            self._ensure_ready()
            payload = self._read_weight_file(request) if isinstance(request, FILE_REQUESTS) else None
            try:
                result: ActorReply = self._get(self._actor.handle.remote(request, payload), name)
            except BaseException:
                self._discard()
                if self.closed:
                    raise WorkerClosed(f"the engine actor of run {self.spec.run_id} was stopped during {name}: "
                                       "the run is ending") from None
                raise
            finally:
                if isinstance(request, p.LoadWeightChunk):
                    Path(request.path).unlink(missing_ok=True)  # the local worker deletes a chunk once read
            if result.poisoned:
                self._discard()  # half-loaded weights: never serve them; the next call gets a fresh, synced actor
            if isinstance(result.reply, p.Failed):
                p.raise_failed(result.reply, self.spec.kind, name)
            return result.reply.value

    def _read_weight_file(self, request: Any) -> bytes:
        """The bytes of the file a request names (its path is on this machine: the trainer's /dev/shm)."""
        try:
            return Path(request.path).read_bytes()
        except OSError as exc:  # the local worker fails so too (an OSError in the worker: infra)
            raise EngineFailed(f"the engine actor of run {self.spec.run_id} cannot be sent {request.path}: {exc}",
                               hint="the stage is retried; the next sync starts from a fresh actor") from exc

    # ---- Ray --------------------------------------------------------------------------

    def _get(self, ref: Any, call: str, timeout_s: float | None = None) -> Any:
        """ray.get; Ray's failures (the actor died, its node was lost, no reply in time) as EngineFailed."""
        ray = self.ray
        try:
            return ray.get(ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise EngineFailed(f"the engine actor of run {self.spec.run_id} was not ready after {timeout_s:.0f} s",
                               hint="check `ray status` (is it pending on resources?), or raise "
                                    "RLPIPE_WORKER_READY_TIMEOUT_S") from exc
        except ray.exceptions.RayError as exc:
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            raise EngineFailed(f"the engine actor of run {self.spec.run_id} died during {call} "
                               f"({type(exc).__name__}: {first_line})",
                               hint="the stage is retried and starts a fresh actor; if it keeps dying, check "
                                    f"`ray status --address {self.address}` and the node's memory") from exc

    def _connect(self) -> None:
        ray = self.ray
        if ray.is_initialized():  # one Ray connection per process: reuse the one made earlier
            return
        from rlpipe.sandbox.ray_pool import check_reachable

        hint = f"check the cluster (`ray status --address {self.address}`), or unset cluster.engine_on_ray"
        check_reachable(self.address, hint)
        try:
            ray.init(address=self.address, log_to_driver=False, configure_logging=False)
        except Exception as exc:  # noqa: BLE001 - ray raises ConnectionError, RuntimeError, ValueError here
            from rlpipe.core.errors import ClusterUnavailable

            raise ClusterUnavailable(f"cannot connect to the Ray cluster at {self.address}: {type(exc).__name__}: {exc}",
                                     hint) from exc
        self._connected_here = True

    def _check_resources(self) -> None:
        """ConfigError when no node of the cluster has the CPUs and GPUs the actor asks for."""
        nodes = [node.get("Resources", {}) for node in self.ray.nodes() if node.get("Alive")]
        if not any(node.get("CPU", 0) >= self.num_cpus and node.get("GPU", 0) >= self.num_gpus for node in nodes):
            have = ", ".join(f"{node.get('CPU', 0):g} CPU/{node.get('GPU', 0):g} GPU" for node in nodes) or "no live node"
            raise ConfigError(f"no node of the Ray cluster at {self.address} has {self.num_cpus:g} CPU and "
                              f"{self.num_gpus:g} GPU for the engine actor (nodes: {have})",
                              "lower cluster.ray_engine_cpus / cluster.ray_engine_gpus, or add a node that has them")
