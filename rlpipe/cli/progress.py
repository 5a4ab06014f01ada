"""The progress display of `rlpipe train`: follows the run through the lake from a side
thread (the flow itself knows nothing of the terminal).

- links.json, once it appears: the MLflow run and the Prefect flow run, printed once;
- qa/before_train.json (with qa.before_train): the quality gate's one-line outcome, printed once;
- progress/warmstart.json: a warm-start bar (steps done of the budget, loss, the last
  greedy-accuracy check against its target);
- committed steps and status.json: the RL-steps bar (stage, mean reward). Steps commit in
  order, so after one listing a poll reads the manifest of the step after the newest
  (`CommittedSteps`): a listing of every step each second costs the controller O(steps)
  (56 ms at 5000 steps on a local disk; pages of LIST requests on S3).
Where the output is not a terminal (a pipe, a log file, CI), rich draws the bars once, at the
end; there a plain line says where the run is whenever it moved, at most every 30 s.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from rlpipe.core.config import RunConfig

if TYPE_CHECKING:
    from rlpipe.storage.lake import Lake
    from rlpipe.storage.lake_records import StepManifest

POLL_S = 1.0
PLAIN_EVERY_S = 30.0
RELIST_S = 60.0
LINKS_DOCUMENT = "links.json"  # written by orchestration/status.py
WARMSTART_DOCUMENT = "progress/warmstart.json"
GATE_DOCUMENT = "qa/before_train.json"  # written by controller/quality_gate.py


def no_prefect_ui(flow_run_id: str) -> str:
    """What to say of the Prefect flow run when there is no UI to link to (ephemeral mode)."""
    return (
        f"flow run {flow_run_id or '-'} (ephemeral mode: Prefect's temporary server has no UI and "
        "stops with `rlpipe train`; for the Prefect UI, start `rlpipe up` before training)"
    )


def link_lines(links: dict[str, Any]) -> list[str]:
    """The two lines that say where to watch a run."""
    mlflow = links.get("mlflow_run_url") or f"{links.get('mlflow_tracking_uri')}  run {links.get('mlflow_run_id')}"
    prefect = links.get("prefect_flow_run_url") or no_prefect_ui(str(links.get("prefect_flow_run_id") or ""))
    return [f"mlflow:  {mlflow}", f"prefect: {prefect}"]


def warmstart_detail(document: dict[str, Any]) -> str:
    detail = f"loss {document['loss']:.3f}" if document.get("loss") is not None else ""
    if document.get("accuracy") is not None:
        target = document.get("target_accuracy")
        detail += f"  accuracy {document['accuracy']:.2f}" + (f" (target {target:.2f})" if target is not None else "")
    return detail


class PlainLines:
    """Progress as plain lines, for output that is not a terminal: a line is printed when
    what it says changed and `every_s` passed since the last one (or when `final`)."""

    def __init__(self, console: Console, every_s: float = PLAIN_EVERY_S) -> None:
        self.console = console
        self.every_s = every_s
        self.started = time.monotonic()
        self._said: str | None = None
        self._said_at = float("-inf")

    def offer(self, line: str, final: bool = False) -> None:
        now = time.monotonic()
        if line == self._said or (not final and now - self._said_at < self.every_s):
            return
        elapsed = int(now - self.started)
        self.console.print(f"[{elapsed // 60}:{elapsed % 60:02d}] {line}", soft_wrap=True, markup=False, highlight=False)
        self._said, self._said_at = line, now


class CommittedSteps:
    """How many steps of a run are committed, and the newest one's manifest, followed cheaply:
    the steps are listed on the first poll and every `relist_s` after it (a step committed
    out of order, which the flows never do, is found then); in between, a poll reads the
    manifests after the newest it knows, until one is missing."""

    def __init__(self, lake: Lake, run_id: str, relist_s: float = RELIST_S) -> None:
        self.lake, self.run_id, self.relist_s = lake, run_id, relist_s
        self.count, self.newest_step = 0, 0
        self.newest: StepManifest | None = None
        self._listed_at: float | None = None

    def poll(self) -> tuple[int, StepManifest | None]:
        """(committed steps, the newest one's manifest or None)."""
        now = time.monotonic()
        if self._listed_at is None or now - self._listed_at >= self.relist_s:
            steps = self.lake.committed_steps(self.run_id)
            self._listed_at = now
            if not steps:
                return 0, None
            if (len(steps), steps[-1]) != (self.count, self.newest_step):
                self.count, self.newest_step = len(steps), steps[-1]
                self.newest = self.lake.read_manifest(self.run_id, self.newest_step)
        while (manifest := self.lake.read_manifest(self.run_id, self.newest_step + 1)) is not None:
            self.count, self.newest_step, self.newest = self.count + 1, self.newest_step + 1, manifest
        return self.count, self.newest


@contextmanager
def follow_run(
    run_config: RunConfig, run_id: str, console: Console, plain_every_s: float = PLAIN_EVERY_S
) -> Iterator[None]:
    from rlpipe.controller.builders import build_lake

    lake = build_lake(run_config)
    committed = CommittedSteps(lake, run_id)
    stop = threading.Event()
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console, transient=False,
    )
    rl_bar = progress.add_task("RL steps", total=run_config.train.steps, detail="starting")
    plain = None if console.is_terminal else PlainLines(console, plain_every_s)
    state: dict[str, Any] = {"links_shown": False, "warmstart_bar": None, "gate_shown": not run_config.qa.before_train}
    try:
        stale_links = lake.read_json(run_id, LINKS_DOCUMENT)  # a resumed run's previous flow run
        stale_gate = lake.read_json(run_id, GATE_DOCUMENT)
    except Exception:  # noqa: BLE001
        stale_links = stale_gate = None

    def show_links() -> None:
        links = lake.read_json(run_id, LINKS_DOCUMENT)
        if links is not None and links != stale_links:
            for line in link_lines(links):
                progress.console.print(line, soft_wrap=True, markup=False)
            state["links_shown"] = True

    def show_gate() -> None:
        """A passed gate's line (a failed gate is the run's error: the CLI prints it)."""
        document = lake.read_json(run_id, GATE_DOCUMENT)
        if document is not None and document != stale_gate and document.get("passed"):
            progress.console.print(str(document.get("line")), soft_wrap=True, markup=False)
            state["gate_shown"] = True

    def show_warmstart(stage: str | None) -> None:
        document = lake.read_json(run_id, WARMSTART_DOCUMENT)
        if document is None:
            return
        bar: TaskID | None = state["warmstart_bar"]
        if bar is None:
            bar = state["warmstart_bar"] = progress.add_task("warm-start", total=int(document["steps_max"]), detail="")
        done = int(document["steps_done"])
        total = done if document.get("finished") else int(document["steps_max"])  # stopped early: full bar
        progress.update(bar, completed=done, total=total, detail=warmstart_detail(document))
        if plain is not None and stage == "warm-start":
            plain.offer(f"warm-start {done}/{int(document['steps_max'])}  {warmstart_detail(document)}".rstrip())

    def poll() -> None:
        while not stop.wait(POLL_S):
            try:
                if not state["links_shown"]:
                    show_links()
                if state["links_shown"] and not state["gate_shown"]:
                    show_gate()
                status = lake.read_status(run_id)
                if status is not None and status.stage == "warm-start" or state["warmstart_bar"] is not None:
                    show_warmstart(status.stage if status is not None else None)
                steps, newest = committed.poll()
                reward = newest.metric("reward/mean") if newest is not None else None
            except Exception:  # noqa: BLE001 - the display is best effort; the flow reports errors
                continue
            detail = f"{status.stage}" if status else ""
            if reward is not None:
                detail += f"  reward {reward:.3f}"
            progress.update(rl_bar, completed=steps, detail=detail)
            if plain is not None and status is not None and status.stage != "warm-start":
                plain.offer(f"RL steps {steps}/{run_config.train.steps}  {detail}".rstrip())

    thread = threading.Thread(target=poll, daemon=True)
    with progress:
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)
            try:
                if not state["gate_shown"]:
                    show_gate()
                progress.update(rl_bar, completed=len(lake.committed_steps(run_id)), detail="")
            except Exception:  # noqa: BLE001
                pass
