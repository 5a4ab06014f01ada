"""A step's metrics logged to MLflow beside the next step, not on its path.

What it does: `StepLogThread.submit(log)` settles the log before it, then runs `log` (one
step's `Tracker.log_step_metrics`) on a thread of its own and returns at once: the
controller goes on to the next step while MLflow writes (into sqlite, ~20-30 ms a step on
2 cores; docs/RESULTS.md, "The CLI's whole step beside the loop and TRL"). At most one log
is in flight, so steps reach MLflow in order. `settle()` waits for it; a log that failed is
run again in the caller's thread, and if it fails again its error (StorageUnavailable, ...)
is raised there and it stays pending for the next `settle` (a retried task's): a failed log
is never dropped, and its error surfaces one step late at most.

What it does not: serialise the tracker's other requests against this thread (Tracker's
lock does), or outlive its process: a log in flight when the controller is killed is lost,
as a synchronous one was between the lake's TRAIN.json and MLflow; the lake keeps every
step's metrics (`rlpipe runs show`, the step_metrics view).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rlpipe.core.errors import StorageUnavailable


class StepLogThread:
    """One metrics log at a time on a thread beside the caller (see the module docstring)."""

    def __init__(self, name: str = "mlflow-step-log") -> None:
        self._name = name
        self._pending: Callable[[], object] | None = None  # submitted, not yet known to be logged
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def submit(self, log: Callable[[], object]) -> None:
        """Settle the log before (its error is raised here, and `log` is not started), then
        start `log` on the thread."""
        self.settle()
        self._pending, self._failure = log, None
        self._thread = threading.Thread(target=self._run, args=(log,), name=self._name, daemon=True)
        self._thread.start()

    def settle(self, wait_s: float | None = None) -> None:
        """Wait for the log in flight (at most `wait_s`: then StorageUnavailable, and it goes
        on); if it failed, run it again here, raising its error when it fails again."""
        thread = self._thread
        if thread is not None:
            thread.join(wait_s)
            if thread.is_alive():
                raise StorageUnavailable(f"a step's metrics are still being logged to MLflow after {wait_s:g} s",
                                         hint="check the tracking server; the lake holds the step's metrics")
            self._thread = None
        if self._pending is None:
            return
        if self._failure is not None:
            self._pending()  # raises: the log stays pending
        self._pending, self._failure = None, None

    def _run(self, log: Callable[[], object]) -> None:
        try:
            log()
        except BaseException as exc:  # noqa: BLE001 - kept for `settle`, which retries and raises
            self._failure = exc
