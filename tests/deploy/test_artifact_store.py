"""An MLflow artifact store whose bucket is missing fails an upload within seconds, naming the
bucket (issue 13, the team stack): against the session's moto S3 server (loopback), both with
an s3:// artifact root that this process uploads to and with a real `mlflow server` that
proxies artifacts to S3 (`--artifacts-destination`, as deploy/compose.yml runs it).

Before the check in storage/artifact_checks.py the proxied case took 277 s for one small
file (the server answers 500 to the upload, MLflow's client retries it 7 times with backoff)
and ended on an error that named neither the bucket nor the cause. The limit below is a hang
guard that the old behaviour fails, not a speed bound.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from rlpipe.core.errors import StorageUnavailable
from rlpipe.storage.tracking import Tracker
from tests.helpers.mlflow_db import seed_mlflow_db
from tests.helpers.ports import free_port
from tests.helpers.s3_server import unique_bucket
from tests.helpers.waiting import returns_within, wait_until

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

UPLOAD_HANG_GUARD_S = 60.0  # the old behaviour: 277 s for one file
MOTO_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _s3(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                        region_name="us-east-1")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def proxying_mlflow(s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A real `mlflow server` (one worker, no job runner, as `rlpipe up` runs it) whose
    artifacts destination is a bucket that does not exist on moto: (its URI, the bucket)."""
    folder = tmp_path_factory.mktemp("mlflow-server")
    seed_mlflow_db(folder / "mlflow.db")
    bucket, port = unique_bucket("mlflow-artifacts"), free_port()
    env = {**os.environ, **MOTO_KEYS, "MLFLOW_S3_ENDPOINT_URL": s3_endpoint, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--artifacts-destination", f"s3://{bucket}/artifacts"],
        stdout=open(folder / "server.log", "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: server.poll() is not None or _answers(f"{uri}/health"), "the MLflow server to answer")
        assert server.poll() is None, (folder / "server.log").read_text()[-3000:]
        yield uri, bucket
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the uvicorn worker it started
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=15)


def test_a_proxying_server_without_its_bucket_fails_the_upload_within_seconds_naming_it(
    proxying_mlflow: tuple[str, str], s3_endpoint: str
) -> None:
    uri, bucket = proxying_mlflow
    tracker = Tracker(uri, "artifacts-bucket-missing")
    run_id = tracker.start_run("no-bucket", tags={}, params={})
    with pytest.raises(StorageUnavailable) as caught:
        returns_within(lambda: tracker.log_text(run_id, "{}", "config.json"), "log_text", UPLOAD_HANG_GUARD_S)
    message = str(caught.value)
    assert f"s3://{bucket}/artifacts" in message and "does not exist" in message, message
    assert "--artifacts-destination" in message  # the hint says what to fix
    # Once the bucket exists the same tracker uploads: a failed check is not remembered.
    _s3(s3_endpoint).create_bucket(Bucket=bucket)
    tracker.log_text(run_id, "{}", "config.json")
    assert [artifact.path for artifact in tracker._client.list_artifacts(run_id)] == ["config.json"]


def test_an_s3_artifact_root_without_its_bucket_fails_within_seconds_naming_it(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {**MOTO_KEYS, "MLFLOW_S3_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(name, value)
    seed_mlflow_db(tmp_path / "mlflow.db")
    bucket = unique_bucket("mlflow-artifacts")
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "s3-bucket-missing", artifact_location=f"s3://{bucket}/exp")
    run_id = tracker.start_run("no-bucket", tags={}, params={})
    report = tmp_path / "report.md"
    report.write_text("# report\n")
    with pytest.raises(StorageUnavailable) as caught:
        returns_within(lambda: tracker.log_artifact(run_id, report, "reports"), "log_artifact", UPLOAD_HANG_GUARD_S)
    assert f"bucket {bucket!r} does not exist at {s3_endpoint}" in str(caught.value)
    assert f"create the bucket {bucket!r}" in caught.value.hint
