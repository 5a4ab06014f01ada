"""What a run says about itself while it runs: status.json (running, failed, interrupted,
finished), links.json (where to watch it: the MLflow run and the Prefect flow run) and
progress/warmstart.json (the warm start's steps, loss and accuracy checks).

Plain functions the train flow and its tasks call; all writes are best effort (the step
manifests are the truth, so a lake that cannot take a status line right now does not fail
the run), and a running run's status.json, rewritten at every step, is not fsynced
(storage/lake.py `write_status`). Not here: deciding when a run fails (flows/), printing anything (cli/).
"""

from __future__ import annotations

import gc
import logging
import signal
import time
import traceback

from prefect.exceptions import TerminationSignal
from prefect.runtime import flow_run
from prefect.utilities.urls import url_for

from rlpipe.controller.runtime import Runtime
from rlpipe.orchestration.run_log import WarmStartLines, log_links
from rlpipe.orchestration.track import link_runs
from rlpipe.storage.lake_records import RunState, RunStatus

log = logging.getLogger(__name__)

LINKS_DOCUMENT = "links.json"
WARMSTART_DOCUMENT = "progress/warmstart.json"
INTERRUPTED = "interrupted by "  # the prefix of status.json's error for a signal (SIGINT, SIGTERM)


def interruption(error: BaseException) -> str | None:
    """"SIGINT" or "SIGTERM" when `error` is how a signal surfaced (^C, `kill`), else None.

    ^C is a KeyboardInterrupt; SIGTERM is Prefect's TerminationSignal inside a flow run and
    the CLI's own KeyboardInterrupt subclass (with `signum`) outside one. The chain of
    causes and contexts is searched too."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:  # also when a library replaced it
        seen.add(id(error))  # (Prefect's task engine raises ValueError for a ^C in its set-up)
        if isinstance(error, TerminationSignal):
            return signal.Signals(error.signal).name
        if isinstance(error, KeyboardInterrupt):
            return signal.Signals(getattr(error, "signum", signal.SIGINT)).name
        error = error.__cause__ or error.__context__
    return None


def release_interrupted_frames(error: BaseException) -> None:
    """Drop the locals of the frames a signal interrupted, and collect them: a SQLite
    transaction cut short there (MLflow's store, in this process) holds the database's
    write lock until its connection is freed, and the run's own end (MLflow KILLED) would
    wait for that lock and fail."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if error.__traceback__ is not None:
            traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__
    gc.collect()


def set_running(runtime: Runtime, step: int, stage: str) -> None:
    _write(runtime, RunState.RUNNING, step, stage, None)


def set_finished(runtime: Runtime, step: int) -> None:
    _write(runtime, RunState.FINISHED, step, "done", None)


def set_failed(runtime: Runtime, step: int, stage: str, error: BaseException) -> None:
    """FAILED with the error; a signal is written as "interrupted by SIGINT" (no traceback
    text), which `rlpipe runs show` reports as an interruption."""
    signal_name = interruption(error)
    message = INTERRUPTED + signal_name if signal_name else f"{type(error).__name__}: {error}"[:2000]
    _write(runtime, RunState.FAILED, step, stage, message)


def _write(runtime: Runtime, state: RunState, step: int, stage: str, message: str | None) -> None:
    run_id = runtime.run_id
    try:
        runtime.records.lake.write_status(RunStatus(run_id, state, step, stage, message, int(time.time() * 1000)))
    except Exception as exc:  # noqa: BLE001 - best effort, see the module docstring
        log.warning("could not write the status of run %s: %s", run_id, exc)


def record_links(runtime: Runtime) -> dict[str, str | None]:
    """links.json of this flow run: the MLflow run (URL when the server has a UI) and the
    Prefect flow run (URL when PREFECT_API_URL names a server; None in ephemeral mode,
    whose temporary server has no UI and stops with the command)."""
    records = runtime.records
    run_id = runtime.run_id
    flow_run_id = str(flow_run.get_id() or "")
    links: dict[str, str | None] = {
        "mlflow_tracking_uri": records.tracker.uri,
        "mlflow_run_id": records.mlflow_run_id,
        "mlflow_run_url": records.tracker.run_url(records.mlflow_run_id),
        "prefect_flow_run_id": flow_run_id,
        "prefect_flow_run_url": (url_for("flow-run", obj_id=flow_run_id) or None) if flow_run_id else None,
    }
    try:
        records.lake.write_json(run_id, LINKS_DOCUMENT, links)
    except Exception as exc:  # noqa: BLE001 - best effort
        log.warning("could not write the links of run %s: %s", run_id, exc)
    link_runs(runtime, links)  # MLflow tags/description <-> a Prefect artifact (orchestration/track.py)
    log_links(links)  # the MLflow run's URL in the flow run's logs (orchestration/run_log.py)
    return links


def write_warmstart_progress(runtime: Runtime, document: dict[str, object]) -> None:
    run_id = runtime.run_id
    try:
        runtime.records.lake.write_json(run_id, WARMSTART_DOCUMENT, document)
    except Exception as exc:  # noqa: BLE001 - best effort
        log.warning("could not write the warm-start progress of run %s: %s", run_id, exc)


class WarmStartProgress:
    """Reports the warm start as it goes: warmstart/loss to MLflow every LOG_EVERY steps
    (one request per batch of points), warmstart/accuracy at each accuracy check, and
    progress/warmstart.json (steps done, last loss, last check) for `rlpipe train`'s
    progress line and `rlpipe runs show`, at most once per WRITE_EVERY_S."""

    LOG_EVERY = 10
    WRITE_EVERY_S = 1.0

    def __init__(self, runtime: Runtime, max_steps: int, target_accuracy: float | None) -> None:
        self.runtime = runtime
        self.run_id = runtime.run_id
        self.document: dict[str, object] = {
            "steps_done": 0, "steps_max": max_steps, "loss": None, "accuracy": None,
            "accuracy_step": None, "target_accuracy": target_accuracy, "finished": False,
        }
        self._losses: list[tuple[int, float]] = []
        self._written_at = 0.0
        self._lines = WarmStartLines(max_steps)  # the flow run's log lines (orchestration/run_log.py)
        self.write(force=True)

    def step(self, step: int, loss: float) -> None:
        self.document.update(steps_done=step, loss=loss)
        self._losses.append((step, loss))
        self._lines.step(step, loss)
        if len(self._losses) >= self.LOG_EVERY:
            self._flush_losses()
        self.write()

    def checked(self, step: int, accuracy: float, per_domain: dict[str, float] | None = None) -> None:
        """`accuracy`: the figure compared with the target; `per_domain`: domain -> its
        accuracy, logged as warmstart/accuracy/<domain>."""
        self.document.update(accuracy=accuracy, accuracy_step=step)
        self._flush_losses()
        self._log("warmstart/accuracy", [(step, accuracy)])
        for domain, value in sorted((per_domain or {}).items()):
            self._log(f"warmstart/accuracy/{domain}", [(step, value)])
        self.write(force=True)

    def finish(self) -> None:
        self.document["finished"] = True
        self._lines.finish()
        self._flush_losses()
        self.write(force=True)

    def write(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._written_at >= self.WRITE_EVERY_S:
            self._written_at = now
            write_warmstart_progress(self.runtime, dict(self.document))

    def _flush_losses(self) -> None:
        points, self._losses = self._losses, []
        self._log("warmstart/loss", points)

    def _log(self, key: str, points: list[tuple[int, float]]) -> None:
        runtime = self.runtime
        try:
            runtime.records.tracker.log_series(runtime.records.mlflow_run_id, key, points)
        except Exception as exc:  # noqa: BLE001 - metrics are not worth failing the warm start for
            log.warning("could not log %s of run %s: %s", key, self.run_id, exc)
