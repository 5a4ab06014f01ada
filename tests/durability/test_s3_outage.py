"""An S3 outage in the middle of a run: the pipeline reaches moto S3 through a TCP proxy
(tests/helpers/tcp_proxy.py); once step 1 is committed the proxy drops every connection and
then, in one mode each:

- `refuse`: refuses new connections (ECONNREFUSED; pyarrow gives up in about 2 s). The lake
  raises StorageUnavailable, an InfraError, so Prefect retries the stage with backoff. The
  outage lasts until Prefect has logged such a retry (and at least OUTAGE_S), and the test
  then finds in Prefect's records a stage that ran more than once and completed.
- `blackhole`: accepts connections and never answers (pyarrow's connect/request timeouts
  would end each attempt in about 17 s). The outage lasts until the proxy holds a request
  of the run (and at least OUTAGE_S); restore() then drops the held connections and the
  client tries again.

Either way the run must finish with exactly the rows of an undisturbed run. OUTAGE_S is
$RLPIPE_TEST_OUTAGE_S (default 3 s). The stage backoff is tests/conftest.py's 0.1 s; to
rehearse the production case (a minute's outage, 1 s backoff), run this file with
RLPIPE_RETRY_BACKOFF_S=1 RLPIPE_TEST_OUTAGE_S=50.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterName

from rlpipe.core.errors import StorageUnavailable
from rlpipe.flows.train import train
from rlpipe.storage.lake import Lake
from rlpipe.storage.query import query_trajectories
from tests.flows.runs import tiny_config
from tests.helpers.s3_server import unique_bucket
from tests.helpers.tcp_proxy import TcpProxy
from tests.helpers.waiting import HANG_GUARD_S, returns_within

pytestmark = pytest.mark.slow

OUTAGE_S = float(os.environ.get("RLPIPE_TEST_OUTAGE_S", "3"))
STEPS = 4


class _StageRetryLogged(logging.Handler):
    """Set once Prefect logs that a stage failed with StorageUnavailable and will be retried."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.seen = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "StorageUnavailable" in message and "Retry" in message:
            self.messages.append(message)
            self.seen.set()


def _outage_after_step_1(
    direct: Lake, run_id: str, proxy: TcpProxy, mode: str, evidence: Callable[[], bool], done: threading.Event
) -> None:
    """Watch the lake behind the proxy's back; once step 1 is committed start the outage, and
    end it when the mode's evidence is in (or the run ended, or the hang guard passed)."""
    while direct.read_manifest(run_id, 1) is None:
        if done.wait(0.1):
            return
    getattr(proxy, mode)()
    started = time.monotonic()
    while not done.is_set() and time.monotonic() - started < HANG_GUARD_S:
        if time.monotonic() - started >= OUTAGE_S and evidence():
            break
        time.sleep(0.05)
    proxy.restore()


def _run_through_an_outage(tmp_path: Path, s3_endpoint: str, mode: str, evidence: Callable[[TcpProxy], bool]):
    """Train STEPS steps on an S3 lake behind a proxy that goes down in `mode` after step 1.
    Returns (summary, the lake read directly, the proxy, run id, start and end of the run)."""
    host, port = s3_endpoint.removeprefix("http://").split(":")
    proxy = TcpProxy(host, int(port)).start()
    run_id = f"outage-{mode}"
    bucket = f"s3://{unique_bucket('outage-' + mode)}/lake"
    config = tiny_config(
        tmp_path, f"train.steps={STEPS}", f'storage.lake_uri="{bucket}"', f'storage.s3_endpoint_url="{proxy.endpoint_url}"'
    )
    direct = Lake.open(bucket, endpoint_url=s3_endpoint)
    done = threading.Event()
    watcher = threading.Thread(
        target=_outage_after_step_1, args=(direct, run_id, proxy, mode, lambda: evidence(proxy), done), daemon=True
    )
    watcher.start()
    started = time.monotonic()
    try:
        summary = train(config, run_id)
    finally:
        finished = time.monotonic()
        done.set()
        watcher.join(timeout=HANG_GUARD_S)
        proxy.stop()
    return summary, direct, proxy, run_id, started, finished


def _assert_the_run_lost_nothing(summary, lake: Lake, run_id: str) -> None:
    assert summary.steps_committed == STEPS
    assert lake.committed_steps(run_id) == list(range(1, STEPS + 1))
    rows = STEPS * 4 * 4  # steps x prompts x samples
    assert query_trajectories(
        lake, "select count(*), count(distinct (run_id, step, task_id, sample_idx)) from trajectories"
    ).rows == [(rows, rows)]
    assert lake.read_status(run_id).state.value == "finished"
    assert lake.latest_checkpoint(run_id) == STEPS


def _assert_the_outage_was_inside_the_run(proxy: TcpProxy, mode: str, started: float, finished: float) -> None:
    assert [kind for _, kind in proxy.events] == [mode, "restore"], proxy.events
    outage_start, outage_end = proxy.events[0][0], proxy.events[1][0]
    assert started < outage_start < outage_end < finished


@pytest.fixture
def aws_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def test_refused_connections_fail_a_stage_that_prefect_retries_and_the_run_loses_nothing(
    tmp_path: Path, s3_endpoint: str, aws_keys: None
) -> None:
    retry_logged = _StageRetryLogged()
    task_run_logger = logging.getLogger("prefect.task_runs")
    level = task_run_logger.level
    if task_run_logger.getEffectiveLevel() > logging.INFO:  # Prefect logs its retries at INFO
        task_run_logger.setLevel(logging.INFO)
    task_run_logger.addHandler(retry_logged)
    try:
        summary, lake, proxy, run_id, started, finished = _run_through_an_outage(
            tmp_path, s3_endpoint, "refuse", lambda proxy: retry_logged.seen.is_set()
        )
    finally:
        task_run_logger.removeHandler(retry_logged)
        task_run_logger.setLevel(level)
    _assert_the_outage_was_inside_the_run(proxy, "refuse", started, finished)
    _assert_the_run_lost_nothing(summary, lake, run_id)
    # what happened: a stage failed on the refused storage, and Prefect ran it again to completion
    assert retry_logged.messages, "no stage failed with StorageUnavailable during the outage"
    retried = asyncio.run(_retried_task_runs(run_id))
    assert retried, "Prefect recorded no task run with more than one attempt"
    assert all(state == "Completed" for _, _, state in retried), retried


def test_unanswered_connections_hold_a_request_and_the_run_loses_nothing(
    tmp_path: Path, s3_endpoint: str, aws_keys: None
) -> None:
    summary, lake, proxy, run_id, started, finished = _run_through_an_outage(
        tmp_path, s3_endpoint, "blackhole", lambda proxy: proxy.held > 0
    )
    _assert_the_outage_was_inside_the_run(proxy, "blackhole", started, finished)
    _assert_the_run_lost_nothing(summary, lake, run_id)
    # what happened: the run sent a request into the black hole and had to wait for it
    # (only the run talks through the proxy: the test's own reads go to moto directly)
    assert proxy.held >= 1


async def _retried_task_runs(run_id: str) -> list[tuple[str, int, str]]:
    """(task run name, attempts, state) of the task runs with more than one attempt, in the run's flow runs."""
    async with get_client() as client:
        flow_runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=run_id))
        )
        task_runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id for run in flow_runs]))
        )
        return [(run.name, run.run_count, run.state.name) for run in task_runs if run.run_count > 1]


@pytest.mark.parametrize("mode", ["refuse", "blackhole"])
def test_lake_errors_during_an_outage_are_storage_unavailable(s3_endpoint: str, aws_keys: None, mode: str) -> None:
    """What the stages see: refused connections fail fast, unanswered ones once the
    connect/request timeouts (storage/filesystem.py) run out, both as StorageUnavailable;
    after restore() the same lake object works again."""
    host, port = s3_endpoint.removeprefix("http://").split(":")
    proxy = TcpProxy(host, int(port)).start()
    try:
        lake = Lake.open(f"s3://{unique_bucket('outage-probe')}/lake", endpoint_url=proxy.endpoint_url)
        lake.write_json("r", "probe/a.json", {"x": 1})
        getattr(proxy, mode)()
        with pytest.raises(StorageUnavailable):
            returns_within(lambda: lake.read_json("r", "probe/a.json"), f"a read during the {mode} outage")
        if mode == "blackhole":
            assert proxy.held >= 1
        proxy.restore()
        assert lake.read_json("r", "probe/a.json") == {"x": 1}
    finally:
        proxy.stop()
