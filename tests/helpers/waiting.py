"""Waiting in tests without betting on the machine's speed: poll for a condition, or guard a
call against hanging, each with a limit generous enough that only a hang reaches it.

What it does: `wait_until` polls a predicate until it holds (returns) or the limit passes
(AssertionError naming what was awaited); `returns_within` runs a call in a thread and gives
its result or re-raises its exception, failing only if it has not returned by the limit.
What it does not: assert how fast anything is. A limit here is a hang guard, minutes on a
loaded 2-core machine, never a speed bound.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

HANG_GUARD_S = 120.0


def wait_until(predicate: Callable[[], bool], what: str, limit_s: float = HANG_GUARD_S, every_s: float = 0.05) -> None:
    """Return once `predicate()` is true; fail the test if it is still false after `limit_s`."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {limit_s:g} s for {what}")
        time.sleep(every_s)


def returns_within(call: Callable[[], T], what: str, limit_s: float = HANG_GUARD_S) -> T:
    """`call()`'s result (or its exception), failing the test if it hangs past `limit_s`."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hang-guard")
    future = pool.submit(call)
    try:
        return future.result(timeout=limit_s)
    except concurrent.futures.TimeoutError:
        raise AssertionError(f"{what} had not returned after {limit_s:g} s") from None
    finally:
        pool.shutdown(wait=False)
