"""StageClock: times the stages of one RL step and remembers which one is running.

The step's task runs (tasks/step_tasks.py) enter their stages on the clock the flow hands
them, so the flow can name the failing stage in status.json (`rlpipe runs show`: "failed at
step 2 in stage verify") and log each stage's seconds (`time/<stage>_s`) although several
stages run inside one task run. `closing` (an Event) stops the async
rollout lane at its next stage: `enter` raises LaneClosed.

Not here: what a stage does (tasks/), the order of the stages (flows/steps.py).
"""

from __future__ import annotations

import threading
import time


class LaneClosed(Exception):
    """The run stopped: the rollout lane leaves before its next stage."""


class StageClock:
    """Seconds per stage of one step; `stage` is the one running."""

    def __init__(self, closing: threading.Event | None = None) -> None:
        self.stage = "start"
        self.seconds: dict[str, float] = {}
        self.closing = closing
        self._started = time.perf_counter()

    def enter(self, stage: str) -> None:
        if self.closing is not None and self.closing.is_set():
            raise LaneClosed(f"the run stopped before stage {stage}")
        now = time.perf_counter()
        self.seconds[self.stage] = self.seconds.get(self.stage, 0.0) + now - self._started
        self.stage, self._started = stage, now

    def timings(self) -> dict[str, float]:
        self.enter(self.stage)  # close the running stage's interval
        return {f"time/{name}_s": seconds for name, seconds in self.seconds.items() if name not in ("start", "done")}
