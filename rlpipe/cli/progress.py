"""A progress bar for `rlpipe train` that follows the run through the lake (committed
steps and status), from a side thread: the flow itself knows nothing of the terminal."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlpipe.core.config import RunConfig

POLL_S = 1.0


@contextmanager
def follow_run(run_config: RunConfig, run_id: str, console: Console) -> Iterator[None]:
    from rlpipe.tasks.builders import build_lake

    lake = build_lake(run_config)
    total = run_config.train.steps
    stop = threading.Event()
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console, transient=False,
    )
    bar = progress.add_task("RL steps", total=total, detail="starting")

    def poll() -> None:
        while not stop.wait(POLL_S):
            try:
                steps = lake.committed_steps(run_id)
                status = lake.read_status(run_id)
                reward = lake.read_manifest(run_id, steps[-1]).metric("reward/mean") if steps else None
            except Exception:  # noqa: BLE001 - the bar is best effort; the flow reports errors
                continue
            detail = f"{status.stage}" if status else ""
            if reward is not None:
                detail += f"  reward {reward:.3f}"
            progress.update(bar, completed=len(steps), detail=detail)

    thread = threading.Thread(target=poll, daemon=True)
    with progress:
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)
            try:
                progress.update(bar, completed=len(lake.committed_steps(run_id)), detail="")
            except Exception:  # noqa: BLE001
                pass
