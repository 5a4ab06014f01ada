"""A step's metrics logged to MLflow beside the next step, not on its path.

What it does: `StepLogThread.submit(log)` settles the log before it, then runs `log` (one
step's `Tracker.log_step_metrics`) on a thread of its own and returns at once: the
controller goes on to the next step while MLflow writes (into sqlite, ~20-30 ms a step on
2 cores; docs/RESULTS.md, "The CLI's whole step beside the loop and TRL"). At most one log
is in flight, so steps reach MLflow in order. `settle()` waits for it; a log that failed is
run again in the caller's thread, and if it fails again its error (StorageUnavailable, ...)
is raised there and it stays pending for the next `settle` (a retried task's): a failed log
is never dropped, and its error surfaces one step late at most.

The thread waits for the next log and ends once it has waited IDLE_EXIT_S for none; a log
submitted after that starts a new one (a thread started per log made the caller wait until
it ran, which is once it gets the GIL from the controller's other threads).

What it does not: serialise the tracker's other requests against this thread (Tracker's
lock does), or outlive its process: a log in flight when the controller is killed is lost,
as a synchronous one was between the lake's TRAIN.json and MLflow; the lake keeps every
step's metrics (`rlpipe runs show`, the step_metrics view), a resume logs the steps it
replays from there (orchestration/track.py), and a checkpoint waits for the log before it
(tasks/lifecycle.py), since a resume from it replays none of its steps.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from rlpipe.core.errors import StorageUnavailable

IDLE_EXIT_S = 30.0
"""How long the thread waits for the next log before it ends."""


class StepLogThread:
    """One metrics log at a time on a thread beside the caller (see the module docstring)."""

    def __init__(self, name: str = "mlflow-step-log", idle_exit_s: float = IDLE_EXIT_S) -> None:
        self._name, self._idle_exit_s = name, idle_exit_s
        self._pending: Callable[[], object] | None = None  # submitted, not yet known to be logged
        self._done: threading.Event | None = None  # set when the pending log's run on the thread ended
        self._failure: BaseException | None = None
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], threading.Event]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None  # the thread that takes the next job; None: none is waiting
        self._thread_lock = threading.Lock()

    def submit(self, log: Callable[[], object]) -> None:
        """Settle the log before (its error is raised here, and `log` is not started), then
        hand `log` to the thread."""
        self.settle()
        done, self._failure = threading.Event(), None  # before the job is queued: the thread may fail it at once
        with self._thread_lock:  # the thread ends only under this lock, and only with no job queued
            if self._thread is None:
                thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                thread.start()  # when it cannot start, nothing is queued or pending
                self._thread = thread
            self._jobs.put((log, done))
        self._pending, self._done = log, done

    def settle(self, wait_s: float | None = None) -> None:
        """Wait for the log in flight (at most `wait_s`: then StorageUnavailable, and it goes
        on); if it failed, run it again here, raising its error when it fails again."""
        done = self._done
        if done is not None:
            if not done.wait(wait_s):
                raise StorageUnavailable(f"a step's metrics are still being logged to MLflow after {wait_s:g} s",
                                         hint="check the tracking server; the lake holds the step's metrics")
            self._done = None
        if self._pending is None:
            return
        if self._failure is not None:
            self._pending()  # raises: the log stays pending
        self._pending, self._failure = None, None

    def _serve(self) -> None:
        while True:
            try:
                log, done = self._jobs.get(timeout=self._idle_exit_s)
            except queue.Empty:
                with self._thread_lock:
                    if self._jobs.empty():
                        self._thread = None
                        return
                continue
            try:
                log()
            except BaseException as exc:  # noqa: BLE001 - kept for `settle`, which retries and raises
                self._failure = exc
            finally:
                done.set()
