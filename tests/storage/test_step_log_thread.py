"""A step's metrics logged to MLflow on the tracker's own thread (storage/step_log_thread.py),
against a sqlite store in a temp folder: the caller goes on while the store writes, the run's
end waits for the log, and a failed log is logged again, never dropped."""

from __future__ import annotations

import threading

import pytest
from mlflow.exceptions import MlflowException

from rlpipe.core.errors import StorageUnavailable
from rlpipe.storage.tracking import Tracker

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")


@pytest.fixture
def tracker(tmp_path) -> Tracker:
    return Tracker(f"sqlite:///{tmp_path / 'mlruns.db'}", "rlpipe-test")


def test_a_step_log_runs_beside_the_caller_and_the_run_end_waits_for_it(tracker: Tracker, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = tracker.start_run("run-soon", tags={}, params={})
    release, writers = threading.Event(), []
    real_log_batch = tracker._client.log_batch

    def held(run: str, metrics: list) -> None:  # the store's write waits until the test releases it
        writers.append(threading.current_thread())
        assert release.wait(60), "the caller was held by the step log it started"
        real_log_batch(run, metrics=metrics)

    monkeypatch.setattr(tracker._client, "log_batch", held)
    tracker.log_step_metrics_soon(run_id, 1, {"reward/mean": 0.25}, timestamp_ms=1000)
    assert tracker.metric_history(run_id, "reward/mean") == []  # returned while the write is held
    release.set()
    tracker.end_run(run_id, "FINISHED")
    assert writers and threading.current_thread() not in writers
    assert tracker.metric_history(run_id, "reward/mean") == [(1, 0.25, 1000)]
    assert tracker.run_status(run_id) == "FINISHED"


def test_a_failed_step_log_is_logged_again_and_raised_only_if_it_fails_again(tracker: Tracker,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = tracker.start_run("run-flaky", tags={}, params={})
    failures_left = [1]
    real_log_batch = tracker._client.log_batch

    def flaky(run: str, metrics: list) -> None:
        if failures_left[0]:
            failures_left[0] -= 1
            raise MlflowException("connection reset (test)")
        real_log_batch(run, metrics=metrics)

    monkeypatch.setattr(tracker._client, "log_batch", flaky)
    tracker.log_step_metrics_soon(run_id, 1, {"reward/mean": 0.1}, timestamp_ms=1)
    tracker.settle()  # failed on the thread, logged again here
    failures_left[0] = 2
    tracker.log_step_metrics_soon(run_id, 2, {"reward/mean": 0.2}, timestamp_ms=2)
    with pytest.raises(StorageUnavailable, match="step 2"):  # failed twice: raised by the next step's log, not started
        tracker.log_step_metrics_soon(run_id, 3, {"reward/mean": 0.3}, timestamp_ms=3)
    tracker.log_step_metrics_soon(run_id, 3, {"reward/mean": 0.3}, timestamp_ms=3)  # a retried track: step 2 first
    tracker.end_run(run_id, "FINISHED")
    assert tracker.metric_history(run_id, "reward/mean") == [(1, 0.1, 1), (2, 0.2, 2), (3, 0.3, 3)]


def test_a_failed_run_ends_even_when_its_last_step_log_fails(tracker: Tracker, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = tracker.start_run("run-failing", tags={}, params={})

    def down(run: str, metrics: list) -> None:
        raise MlflowException("connection refused (test)")

    monkeypatch.setattr(tracker._client, "log_batch", down)
    tracker.log_step_metrics_soon(run_id, 1, {"reward/mean": 0.1}, timestamp_ms=1)
    with pytest.raises(StorageUnavailable, match="step 1"):
        tracker.end_run(run_id, "FAILED")
    assert tracker.run_status(run_id) == "FAILED"


def test_logs_run_in_order_on_one_thread_which_ends_when_idle_and_comes_back() -> None:
    from rlpipe.storage.step_log_thread import StepLogThread

    ran: list[tuple[int, threading.Thread]] = []
    logs = StepLogThread()  # idle for 30 s before its thread ends: not within this test
    for step in (1, 2, 3):
        logs.submit(lambda step=step: ran.append((step, threading.current_thread())))
    logs.settle()
    assert [step for step, _ in ran] == [1, 2, 3]
    assert len({thread for _, thread in ran}) == 1 and threading.current_thread() not in {thread for _, thread in ran}
    idle = StepLogThread(idle_exit_s=0.05)
    idle.submit(lambda: ran.append((4, threading.current_thread())))
    idle.settle()
    first = ran[-1][1]
    first.join(10)  # idle for idle_exit_s: it ends
    assert not first.is_alive()
    idle.submit(lambda: ran.append((5, threading.current_thread())))
    idle.settle()
    assert [step for step, _ in ran] == [1, 2, 3, 4, 5] and ran[-1][1] is not first and ran[-1][1].name == first.name


def test_a_thread_that_cannot_start_leaves_nothing_pending(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlpipe.storage.step_log_thread import StepLogThread

    logs = StepLogThread()

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread (test)")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(RuntimeError, match="can't start"):
        logs.submit(lambda: None)
    monkeypatch.undo()
    logs.settle(wait_s=5)  # nothing pending: returns at once, never waits for a log no thread runs
    ran: list[int] = []
    logs.submit(lambda: ran.append(1))  # and the next log starts a thread
    logs.settle(wait_s=5)
    assert ran == [1]
