"""A pool of pre-warmed sandboxes of any backend: bounded concurrency, reset between uses.

`SandboxPool(factory, size)` makes `size` sandboxes up front (in parallel, so docker's
half-second starts overlap), hands them out with `with pool.acquire() as sandbox:`, resets
each one when it comes back, and replaces one that fails its reset or its health check.
`pool.map(fn, items)` fans `fn(sandbox, item)` out over a thread pool of the same size,
which is how the verify stage checks a batch of completions inside one task.

The default size is bounded by host cores and memory (`default_pool_size`). Leaked
sandboxes of an earlier crashed process are reaped at start through the backend's own
`reap_leaked` callable (e.g. `bwrap.reap_leaked_sandboxes`), so this module knows no backend.
What it does not do: share one sandbox between two users at once, or bound CPU share per
sandbox (concurrency is the bound).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from rlpipe.core.errors import InfraError, SandboxUnavailable
from rlpipe.sandbox.base import Sandbox

Item = TypeVar("Item")
Result = TypeVar("Result")


def default_pool_size(memory_mb_per_sandbox: int, memory_fraction: float = 0.5) -> int:
    """One sandbox per core, but no more than `memory_fraction` of available memory allows."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    available_mb = _available_memory_mb()
    by_memory = int(available_mb * memory_fraction // max(1, memory_mb_per_sandbox)) if available_mb else cores
    return max(1, min(cores, by_memory))


def healthy(sandbox: Sandbox) -> bool:
    """The default health check: `true` runs and exits 0 within 10 s."""
    try:
        return sandbox.exec(["true"], timeout_s=10.0).exit_code == 0
    except Exception:  # noqa: BLE001 - a sandbox that raises is unhealthy, whatever it raised
        return False


class SandboxPool:
    """Pre-warmed sandboxes from `factory`, lent one user at a time."""

    def __init__(
        self,
        factory: Callable[[], Sandbox],
        size: int | None = None,
        *,
        memory_mb_per_sandbox: int = 512,
        reap_leaked: Callable[[], int] | None = None,
        health_check: Callable[[Sandbox], bool] = healthy,
        check_on_acquire: bool = False,
    ) -> None:
        self.factory = factory
        self.size = size if size is not None else default_pool_size(memory_mb_per_sandbox)
        if self.size < 1:
            raise ValueError(f"a pool needs at least one sandbox, got size={self.size}")
        self.health_check = health_check
        self.check_on_acquire = check_on_acquire
        self.reaped_at_start = reap_leaked() if reap_leaked else 0
        self.replaced = 0
        self.last_error: Exception | None = None
        self._idle: queue.SimpleQueue[Sandbox] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._all: list[Sandbox] = []
        with ThreadPoolExecutor(max_workers=self.size) as executor:
            futures = [executor.submit(factory) for _ in range(self.size)]
        errors = [future.exception() for future in futures if future.exception() is not None]
        for future in futures:
            if future.exception() is None:
                self._adopt(future.result())
        if errors:
            self.close()
            raise errors[0]

    @contextmanager
    def acquire(self, timeout_s: float | None = None) -> Iterator[Sandbox]:
        """Lend one sandbox; reset (or replaced, if broken) when the `with` block ends."""
        sandbox = self._take(timeout_s)
        broken = False
        try:
            yield sandbox
        except InfraError:
            broken = True
            raise
        finally:
            self._give_back(sandbox, broken)

    def map(self, fn: Callable[[Sandbox, Item], Result], items: Iterable[Item]) -> list[Result]:
        """`[fn(sandbox, item) for item in items]`, `size` at a time, results in input order."""

        def run_one(item: Item) -> Result:
            with self.acquire() as sandbox:
                return fn(sandbox, item)

        with ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="sandbox-pool") as executor:
            return list(executor.map(run_one, items))

    def check_idle(self) -> int:
        """Health-check every idle sandbox now, replacing the broken ones; returns how many were replaced."""
        replaced = 0
        for _ in range(self._idle.qsize()):
            try:
                sandbox = self._idle.get_nowait()
            except queue.Empty:
                break
            if self.health_check(sandbox):
                self._idle.put(sandbox)
            else:
                self._replace(sandbox)
                replaced += 1
        return replaced

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sandboxes, self._all = self._all, []
        for sandbox in sandboxes:
            try:
                sandbox.close()
            except Exception:  # noqa: BLE001 - close the rest whatever one of them does
                pass

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def idle_count(self) -> int:
        return self._idle.qsize()

    def _take(self, timeout_s: float | None) -> Sandbox:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if self._closed:
                raise SandboxUnavailable("the sandbox pool is closed", hint="make a new SandboxPool")
            if not self._all:
                raise SandboxUnavailable(f"every sandbox of the pool broke and none could be remade: {self.last_error}",
                                         hint="run `rlpipe sandbox selftest` to see what the backend lacks")
            wait_s = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if wait_s <= 0:
                raise SandboxUnavailable(f"no sandbox free within {timeout_s} s (pool of {self.size})",
                                         hint="raise the pool size or the acquire timeout")
            try:
                sandbox = self._idle.get(timeout=wait_s)
            except queue.Empty:
                continue
            if not self.check_on_acquire or self.health_check(sandbox):
                return sandbox
            self._replace(sandbox)

    def _give_back(self, sandbox: Sandbox, broken: bool) -> None:
        if self._closed:
            sandbox.close()
            return
        if not broken:
            try:
                sandbox.reset()
            except Exception:  # noqa: BLE001 - a sandbox that cannot reset is replaced
                broken = True
        if broken:
            self._replace(sandbox)
        else:
            self._idle.put(sandbox)

    def _replace(self, sandbox: Sandbox) -> None:
        with self._lock:
            if sandbox in self._all:
                self._all.remove(sandbox)
        try:
            sandbox.close()
        except Exception:  # noqa: BLE001
            pass
        try:
            self._adopt(self.factory())
        except Exception as exc:  # noqa: BLE001 - the pool shrinks; _take reports it once empty
            self.last_error = exc
            return
        self.replaced += 1

    def _adopt(self, sandbox: Sandbox) -> None:
        with self._lock:
            self._all.append(sandbox)
        self._idle.put(sandbox)


def _available_memory_mb() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0
