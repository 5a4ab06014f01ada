"""Sandboxed verification on a Ray cluster: `RaySandboxPool`, with SandboxPool's `map` and `close`.

With `cluster.ray_address` set, controller/launch.py builds this instead of a local SandboxPool,
and the verify stage (controller/verify_batch.py) calls `pool.map(fn, items)` on it unchanged.

Shape: `workers` Ray actors, spread over the cluster's nodes, each owning an ordinary
SandboxPool of pre-warmed sandboxes on its node (built from the same `factory` and
`reap_leaked` the local pool gets). `map` puts `fn` in the object store once, cuts `items`
into shares of one actor's pool size, keeps two shares in flight per actor (the actors run
two calls at once, so an actor's sandboxes never wait for the driver between shares), and
puts every verdict back at its item's index: the same results, in the same order, as
`SandboxPool.map(fn, items)` gives.

Why actors, not Ray tasks or prefect-ray's RayTaskRunner: a sandbox is expensive to start
(docker: ~0.5 s; bwrap's warm interpreter) and cheap to reset, and the whole point of the
pool is to reuse warm ones. A Ray task would build and tear down a sandbox per call (or per
share); an actor keeps its pool warm across shares and across steps. RayTaskRunner runs
Prefect tasks on Ray; our fan-out is inside one Prefect task (a task per completion would
drown the server: docs/ARCHITECTURE.md, "Process model"), so there is nothing for it to run.

Failures: the cluster unreachable at start, an actor that died (its node lost, killed), no
share back within `timeout_s`, or a pool an actor could not build all raise
ClusterUnavailable, an InfraError: the stage is retried and no verdict of that batch is
kept. The actors (and the connection this pool made) are dropped then, and the next `map`
connects again and starts fresh ones. An exception `fn`
raised inside an actor is raised here as itself (as the local pool would). Ray is imported
only when this pool is built; without it, a ConfigError says how to install it.

What it does not do: start or stop a Ray cluster, ship rlpipe's code to the nodes (each
node's Python must import the same rlpipe), or retry a failed share itself (the stage does).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from rlpipe.core.errors import ClusterUnavailable, ConfigError
from rlpipe.sandbox.base import Sandbox
from rlpipe.sandbox.pool import SandboxPool

Item = TypeVar("Item")
Result = TypeVar("Result")

INSTALL_HINT = ("run `make venv-ray` and start rlpipe with .venv-ray/bin/rlpipe (ray is an optional extra: "
                "pip install 'rlpipe[ray]'), or unset cluster.ray_address to verify on the local pool")
SHARES_IN_FLIGHT_PER_WORKER = 2


@dataclass(frozen=True)
class WorkerInfo:
    """Where one verifier actor runs and how many sandboxes its pool holds."""

    host: str
    node_id: str  # Ray's id of the node (two nodes may share a host name)
    pid: int
    pool_size: int


class VerifierWorker:
    """The body of one Ray actor: a SandboxPool on its node, lent to `map` calls."""

    def __init__(self, factory: Callable[[], Sandbox], size: int | None, memory_mb_per_sandbox: int,
                 reap_leaked: Callable[[], int] | None) -> None:
        self.pool = SandboxPool(factory, size, memory_mb_per_sandbox=memory_mb_per_sandbox, reap_leaked=reap_leaked)

    def info(self) -> WorkerInfo:
        import ray  # inside an actor: ray is there

        return WorkerInfo(host=socket.gethostname(), node_id=ray.get_runtime_context().get_node_id(), pid=os.getpid(),
                          pool_size=self.pool.size)

    def map(self, fn: Callable[[Sandbox, Any], Any], items: list[Any]) -> list[Any]:
        return self.pool.map(fn, items)

    def close(self) -> None:
        self.pool.close()


def import_ray() -> Any:
    """The ray module, or a ConfigError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"cluster.ray_address is set but ray is not installed in this Python ({exc})", INSTALL_HINT) from exc
    return ray


def check_reachable(address: str, hint: str, timeout_s: float = 5.0) -> None:
    """ClusterUnavailable unless `host:port` (or `ray://host:port`) accepts a TCP connection
    within `timeout_s`: ray.init itself waits minutes on an address nobody answers."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"cluster.ray_address={address!r} is not host:port", 'e.g. cluster.ray_address="10.0.0.5:6379"')
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterUnavailable(f"the Ray cluster at {address} is unreachable: {exc}", hint) from exc


class RaySandboxPool:
    """Verifier actors on a Ray cluster, each with its own pool of `size` sandboxes from `factory`."""

    def __init__(self, address: str, factory: Callable[[], Sandbox], *, workers: int = 2, size: int | None = None,
                 memory_mb_per_sandbox: int = 512, reap_leaked: Callable[[], int] | None = None,
                 cpus_per_worker: float = 1.0, timeout_s: float = 600.0) -> None:
        if workers < 1:
            raise ValueError(f"a Ray pool needs at least one worker, got workers={workers}")
        self.ray = import_ray()
        self.address = address
        self.workers = workers
        self.timeout_s = timeout_s
        self._actor_args = (factory, size, memory_mb_per_sandbox, reap_leaked)
        self._cpus_per_worker = cpus_per_worker
        self._actors: list[Any] = []
        self.infos: list[WorkerInfo] = []
        self._connected_here = False
        self._connect()
        self._start_actors()

    def map(self, fn: Callable[[Sandbox, Item], Result], items: Iterable[Item]) -> list[Result]:
        """`[fn(sandbox, item) for item in items]` on the cluster's sandboxes, results in input order."""
        items = list(items)
        if not items:
            return []
        if not self._actors:  # the first map after a failure: connect again, fresh actors
            self._connect()
            self._start_actors()
        ray = self.ray
        try:
            fn_ref = ray.put(fn)
        except ray.exceptions.RayError as exc:
            self._fail()
            raise ClusterUnavailable(f"cannot put the verify function in the object store: {exc}", self._hint()) from exc
        share_size = max(1, min(info.pool_size for info in self.infos))
        shares = [items[start:start + share_size] for start in range(0, len(items), share_size)]
        results: list[list[Result] | None] = [None] * len(shares)
        waiting = list(range(len(shares)))[::-1]  # popped from the end: the first share first
        in_flight: dict[Any, tuple[int, int]] = {}  # ref -> (share index, actor index)

        def submit(actor_index: int) -> None:
            share_index = waiting.pop()
            in_flight[self._actors[actor_index].map.remote(fn_ref, shares[share_index])] = (share_index, actor_index)

        for _ in range(SHARES_IN_FLIGHT_PER_WORKER):
            for actor_index in range(len(self._actors)):
                if waiting:
                    submit(actor_index)
        while in_flight:
            try:
                done, _ = ray.wait(list(in_flight), num_returns=1, timeout=self.timeout_s)
            except ray.exceptions.RayError as exc:
                self._fail()
                raise ClusterUnavailable(f"the Ray cluster at {self.address} failed while verifying: {exc}", self._hint()) from exc
            if not done:
                self._fail()
                raise ClusterUnavailable(f"no verdicts from the Ray cluster at {self.address} within {self.timeout_s} s "
                                         f"({len(in_flight)} shares of {share_size} pending)", self._hint())
            share_index, actor_index = in_flight.pop(done[0])
            results[share_index] = self._get(done[0])
            if waiting:
                submit(actor_index)
        return [result for share in results for result in share]  # type: ignore[union-attr] - every share is filled

    def close(self) -> None:
        """Stop the actors (their sandboxes go with them) and disconnect if this pool connected."""
        self._fail()

    def __enter__(self) -> RaySandboxPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def size(self) -> int:
        """Sandboxes over all actors."""
        return sum(info.pool_size for info in self.infos)

    def _connect(self) -> None:
        ray = self.ray
        if ray.is_initialized():  # one Ray connection per process: reuse the one made earlier
            return
        check_reachable(self.address, self._hint())
        try:
            ray.init(address=self.address, log_to_driver=False, configure_logging=False)
        except Exception as exc:  # noqa: BLE001 - ray raises ConnectionError, RuntimeError, ValueError here
            raise ClusterUnavailable(f"cannot connect to the Ray cluster at {self.address}: {type(exc).__name__}: {exc}",
                                     self._hint()) from exc
        self._connected_here = True

    def _start_actors(self) -> None:
        ray = self.ray
        remote_class = ray.remote(VerifierWorker).options(
            num_cpus=self._cpus_per_worker, max_concurrency=SHARES_IN_FLIGHT_PER_WORKER, scheduling_strategy="SPREAD",
            max_restarts=0)
        try:
            self._actors = [remote_class.remote(*self._actor_args) for _ in range(self.workers)]
            self.infos = [self._get(actor.info.remote()) for actor in self._actors]
        except BaseException:
            self._fail()
            raise

    def _get(self, ref: Any) -> Any:
        """ray.get, with Ray's failures translated: the cause of a task error is raised as itself
        (an InfraError of a broken backend stays one), the rest become ClusterUnavailable."""
        ray = self.ray
        try:
            return ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.RayTaskError as exc:
            self._fail()
            cause = exc.cause
            if isinstance(cause, Exception):
                raise cause from exc
            raise ClusterUnavailable(f"a verifier actor failed: {type(cause).__name__}: {cause}", self._hint()) from exc
        except ray.exceptions.RayError as exc:  # an actor died, its node was lost, a get timed out
            self._fail()
            raise ClusterUnavailable(f"the Ray cluster at {self.address} failed a verification share: "
                                     f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                                     self._hint()) from exc

    def _fail(self) -> None:
        """After a failure: drop the actors and, if this pool connected, the connection too (a
        cluster that was restarted is reached again by the next `map`)."""
        self._drop_actors()
        if self._connected_here and self.ray.is_initialized():
            self.ray.shutdown()
            self._connected_here = False

    def _drop_actors(self) -> None:
        actors, self._actors, self.infos = self._actors, [], []
        for actor in actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - an actor already gone, a cluster already down: drop the rest anyway
                pass

    def _hint(self) -> str:
        return (f"check the cluster (`ray status --address {self.address}`); the stage is retried with fresh actors. "
                "Unset cluster.ray_address to verify on the local pool")
