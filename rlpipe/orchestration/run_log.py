"""Progress lines in the Prefect flow run's logs (the UI's Logs tab of a run started from
the form), the progress `rlpipe train` shows in a terminal: where the run is tracked (the
MLflow run's URL), the warm start's steps (at most every EVERY_S, and when it ends; its
accuracy checks are logged by tasks/lifecycle.py), and one line per RL step with its mean
reward and wall time.

Lines go through Prefect's run logger inside a flow or task run (Prefect ships them to its
API with the flow run's id), else through this module's logger (a plain call). `rlpipe
train` hides Prefect's INFO lines unless --verbose (cli/main.py): its own display reads the
lake (cli/progress.py).

Not here: metrics (MLflow, the lake: orchestration/track.py), status.json (orchestration/status.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from prefect import get_run_logger
from prefect.exceptions import MissingContextError

EVERY_S = 30.0
"""The least time between two warm-start progress lines (its last line is always logged)."""


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    """Prefect's run logger inside a flow or task run, else this module's logger."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


def log_links(links: Mapping[str, str | None]) -> None:
    """Where the run is tracked: the MLflow run's URL (else its tracking URI and run id)."""
    mlflow = links.get("mlflow_run_url") or f"{links.get('mlflow_tracking_uri')} run {links.get('mlflow_run_id')}"
    run_logger().info("MLflow run: %s", mlflow)


def log_rl_step(step: int, steps: int, metrics: Mapping[str, float]) -> None:
    """One line for a trained RL step: its mean reward, the loss and its wall time."""
    parts = [f"reward {metrics['reward/mean']:.3f}"] if "reward/mean" in metrics else []
    if "train/loss" in metrics:
        parts.append(f"loss {metrics['train/loss']:.4f}")
    if "time/step_s" in metrics:
        parts.append(f"{metrics['time/step_s']:.1f} s")
    run_logger().info("RL step %d/%d: %s", step, steps, ", ".join(parts) or "trained")


class WarmStartLines:
    """The warm start's progress lines: its first step, then a step at most every `every_s`,
    and a last line when it ends (steps done of the budget, the last loss)."""

    def __init__(self, max_steps: int, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_steps, self.every_s, self.clock = max_steps, every_s, clock
        self._logged_at: float | None = None
        self._last: tuple[int, float] | None = None

    def step(self, step: int, loss: float) -> None:
        self._last = (step, loss)
        now = self.clock()
        if self._logged_at is None or now - self._logged_at >= self.every_s:
            self._logged_at = now
            run_logger().info("warm-start step %d/%d: loss %.4f", step, self.max_steps, loss)

    def finish(self) -> None:
        if self._last is None:
            run_logger().info("warm start: no supervised step (warmstart.steps = %d)", self.max_steps)
            return
        step, loss = self._last
        run_logger().info("warm start done: %d of at most %d steps, last loss %.4f", step, self.max_steps, loss)
