"""MLflow tracking against a sqlite store in a temp folder (no server), plus URI resolution."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from mlflow.exceptions import MlflowException

from rlpipe.core.errors import RunNotFoundError, StorageUnavailable
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import StepManifest
from rlpipe.storage.local_services import LocalServices, read_services, write_services
from rlpipe.storage.tracking import Tracker, resolve_tracking_uri
from tests.helpers.ports import free_port
from tests.helpers.s3_server import unique_bucket
from tests.helpers.trajectories import make_trajectories
from tests.helpers.waiting import returns_within

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")


@pytest.fixture(scope="module")
def tracker(tmp_path_factory: pytest.TempPathFactory) -> Tracker:
    folder = tmp_path_factory.mktemp("mlflow")
    return Tracker(f"sqlite:///{folder / 'mlruns.db'}", "rlpipe-test")


def test_params_tags_and_status(tracker: Tracker) -> None:
    run_id = tracker.start_run("run-a", tags={"rlpipe.run_id": "a"}, params={"train.lr": 0.0001, "train.steps": 20})
    tracker.set_tags(run_id, {"prefect.flow_run_id": "f-1"})
    run = tracker._client.get_run(run_id)
    assert run.data.params == {"train.lr": "0.0001", "train.steps": "20"}
    assert run.data.tags["rlpipe.run_id"] == "a" and run.data.tags["prefect.flow_run_id"] == "f-1"
    assert run.info.run_name == "run-a"
    tracker.end_run(run_id, "FAILED")
    assert tracker.run_status(run_id) == "FAILED"
    tracker.resume_run(run_id)
    assert tracker.run_status(run_id) == "RUNNING"
    tracker.end_run(run_id, "FINISHED")
    assert tracker.run_status(run_id) == "FINISHED"
    assert tracker.run_url(run_id) is None  # no UI for a sqlite store


def test_relogging_a_step_adds_no_point(tracker: Tracker) -> None:
    run_id = tracker.start_run("run-b", tags={}, params={})
    assert tracker.log_step_metrics(run_id, 1, {"reward/mean": 0.5, "train/loss": 2.0}, timestamp_ms=1000) == 2
    assert tracker.log_step_metrics(run_id, 2, {"reward/mean": 0.75}, timestamp_ms=2000) == 1
    # a retried step 1 (same manifest) and a resumed one with a new extra metric
    assert tracker.log_step_metrics(run_id, 1, {"reward/mean": 0.5, "train/loss": 2.0}, timestamp_ms=1000) == 0
    assert tracker.log_step_metrics(run_id, 1, {"reward/mean": 0.9, "train/kl": 0.1}, timestamp_ms=5000) == 1
    assert tracker.metric_history(run_id, "reward/mean") == [(1, 0.5, 1000), (2, 0.75, 2000)]
    assert tracker.metric_history(run_id, "train/kl") == [(1, 0.1, 5000)]


def test_a_run_latest_steps_are_read_once_and_again_after_a_failed_log(tracker: Tracker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's metrics cost one store request: the run's latest steps are read at its first
    log and then kept by the Tracker (still deduplicating); a log that fails drops them, so
    the next one reads the store again (the failed request may have been applied in part)."""
    run_id = tracker.start_run("run-reads", tags={}, params={})
    reads: list[str] = []
    real_get_run, real_log_batch = tracker._client.get_run, tracker._client.log_batch
    monkeypatch.setattr(tracker._client, "get_run", lambda run: reads.append(run) or real_get_run(run))
    for step in (1, 2, 3):
        assert tracker.log_step_metrics(run_id, step, {"reward/mean": step / 10}, timestamp_ms=step) == 1
    assert tracker.log_step_metrics(run_id, 2, {"reward/mean": 0.2}, timestamp_ms=2) == 0
    assert reads == [run_id]

    def half_applied(run: str, metrics: list) -> None:  # the store took the points, the reply was lost
        real_log_batch(run, metrics=metrics)
        raise MlflowException("connection reset (test)")

    monkeypatch.setattr(tracker._client, "log_batch", half_applied)
    with pytest.raises(StorageUnavailable):
        tracker.log_step_metrics(run_id, 4, {"reward/mean": 0.4}, timestamp_ms=4)
    monkeypatch.setattr(tracker._client, "log_batch", real_log_batch)
    assert tracker.log_step_metrics(run_id, 4, {"reward/mean": 0.4}, timestamp_ms=4) == 0  # the retry finds the point
    assert reads == [run_id, run_id]
    assert [step for step, _, _ in tracker.metric_history(run_id, "reward/mean")] == [1, 2, 3, 4]


def test_artifacts_text_and_reward_curve(tracker: Tracker, tmp_path: Path) -> None:
    run_id = tracker.start_run("run-c", tags={}, params={})
    report = tmp_path / "qa.md"
    report.write_text("# QA\nall good\n")
    tracker.log_artifact(run_id, report, "reports")
    tracker.log_text(run_id, '{"a": 1}', "config.json")
    lake = Lake.open(str(tmp_path / "lake"))
    for step, reward in ((1, 0.25), (2, 0.5)):
        part = lake.write_part("r1", step, "p", make_trajectories("r1", step, 2))
        lake.commit_step(StepManifest("r1", step, step, (part,), 2, (("reward/mean", reward),), 1000 + step))
    assert tracker.log_reward_curve(run_id, lake, "r1") == [(1, 0.25), (2, 0.5)]
    listed = {a.path for a in tracker._client.list_artifacts(run_id)}
    assert {"reports", "config.json", "plots"} <= listed
    plots = [a.path for a in tracker._client.list_artifacts(run_id, "plots")]
    assert plots == ["plots/reward.png"]
    local = tracker._client.download_artifacts(run_id, "plots/reward.png", str(tmp_path / "dl"))
    assert Path(local).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (Path(tracker._client.download_artifacts(run_id, "reports/qa.md", str(tmp_path / "dl"))).read_text()
            == "# QA\nall good\n")


def test_two_trackers_in_one_process_do_not_mix(tracker: Tracker, tmp_path: Path) -> None:
    other = Tracker(f"sqlite:///{tmp_path / 'other.db'}", "other")
    first = tracker.start_run("x", tags={}, params={})
    second = other.start_run("y", tags={}, params={})
    tracker.log_step_metrics(first, 0, {"m": 1.0})
    other.log_step_metrics(second, 0, {"m": 2.0})
    assert [v for _, v, _ in tracker.metric_history(first, "m")] == [1.0]
    assert [v for _, v, _ in other.metric_history(second, "m")] == [2.0]


def test_unknown_run_is_run_not_found(tracker: Tracker) -> None:
    with pytest.raises(RunNotFoundError):
        tracker.resume_run("0123456789abcdef0123456789abcdef")


def test_unreachable_server_is_storage_unavailable() -> None:
    with pytest.raises(StorageUnavailable):
        returns_within(lambda: Tracker(f"http://127.0.0.1:{free_port()}", "x"), "Tracker()")


def test_resolve_prefers_configured_then_live_service_then_sqlite(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert resolve_tracking_uri("http://mlflow:5000", home, tmp_path) == "http://mlflow:5000"
    assert resolve_tracking_uri(None, home, tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlruns.db"
    # a recorded service whose process is gone is ignored
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_services(LocalServices("http://127.0.0.1:1/api", f"http://127.0.0.1:{free_port()}", (dead.pid,)), home)
    assert read_services(home) is not None
    assert resolve_tracking_uri(None, home, tmp_path).startswith("sqlite:///")
    # a live one (this test process listening on a port) is used
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        uri = f"http://127.0.0.1:{listener.getsockname()[1]}"
        write_services(LocalServices("http://127.0.0.1:4200/api", uri, (os.getpid(),)), home)
        assert resolve_tracking_uri(None, home, tmp_path) == uri


def test_services_home_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLPIPE_HOME", str(tmp_path / "rh"))
    services = LocalServices("http://127.0.0.1:4200/api", "http://127.0.0.1:5000", (11, 12), 99)
    path = write_services(services)
    assert path == tmp_path / "rh" / "services.json"
    assert read_services() == services
    assert services.prefect_ui_url == "http://127.0.0.1:4200"
    path.write_text("{torn")
    assert read_services() is None


def test_artifacts_can_live_on_s3(tracker: Tracker, s3_endpoint: str, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's own S3 artifact repository (boto3) against the moto server."""
    monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    bucket = unique_bucket("mlflow-artifacts")
    Lake.open(f"s3://{bucket}", endpoint_url=s3_endpoint)  # creates the bucket
    on_s3 = Tracker(tracker.uri, "s3-artifacts", artifact_location=f"s3://{bucket}/exp")
    run_id = on_s3.start_run("s3-run", tags={}, params={})
    on_s3.log_text(run_id, "hello", "notes/hello.txt")
    lake = Lake.open(f"s3://{bucket}", endpoint_url=s3_endpoint)
    stored = lake.location.filesystem.get_file_info(pafs.FileSelector(f"{bucket}/exp", recursive=True))
    assert any(info.path.endswith("notes/hello.txt") for info in stored)


def test_out_of_order_steps_are_still_deduplicated(tracker: Tracker) -> None:
    run_id = tracker.start_run("run-d", tags={}, params={})
    tracker.log_step_metrics(run_id, 5, {"heldout/accuracy": 0.5}, timestamp_ms=10)
    assert tracker.log_step_metrics(run_id, 3, {"heldout/accuracy": 0.4}, timestamp_ms=11) == 1
    assert tracker.log_step_metrics(run_id, 3, {"heldout/accuracy": 0.4}, timestamp_ms=11) == 0
    assert tracker.log_step_metrics(run_id, 5, {"heldout/accuracy": 0.5}, timestamp_ms=10) == 0
    assert [s for s, _, _ in tracker.metric_history(run_id, "heldout/accuracy")] == [3, 5]


def test_two_processes_opening_a_new_sqlite_store_at_once_both_succeed(tmp_path: Path) -> None:
    """Two runs started at once in one folder both create ./mlruns.db: MLflow migrates a new
    database on first use, and without the store lock the two migrations raced and both runs
    crashed (`table _alembic_tmp_metrics already exists`)."""
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    code = f"from rlpipe.storage.tracking import Tracker; print(Tracker({uri!r}, 'both').experiment_id)"
    processes = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(process.wait(timeout=600), *process.communicate()) for process in processes]
    for returncode, _, stderr in results:
        assert returncode == 0, stderr[-3000:]
    assert len({stdout.strip() for _, stdout, _ in results}) == 1  # one experiment, found by both


def test_the_experiment_opens_in_the_training_runs_view(tracker: Tracker) -> None:
    """The experiment tag older MLflow UIs read, and the query MLflow 3.17's UI follows."""
    from rlpipe.storage.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG

    experiment = tracker._client.get_experiment(tracker.experiment_id)
    assert experiment.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"
    tracker._client.delete_experiment_tag(tracker.experiment_id, EXPERIMENT_KIND_TAG)
    reopened = Tracker(tracker.uri, tracker.experiment)  # an experiment from before the tag gets it
    assert reopened._client.get_experiment(tracker.experiment_id).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    reopened.uri = "http://127.0.0.1:5000"
    assert reopened.run_url("abc") == f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs/abc?workflowType=machine_learning"
