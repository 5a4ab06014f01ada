"""Bounded checks of an MLflow artifact store, run before a run's first artifact upload.

What it does: `check_s3_bucket` HEADs the bucket of an s3:// artifact root where MLflow's S3
repository uploads (MLFLOW_S3_ENDPOINT_URL), 2 attempts of at most 5 s to connect and 10 s
to read; `check_proxied_store` lists a root that an MLflow server proxies (mlflow-artifacts:/)
with one retry and the same bounds. Either raises StorageUnavailable naming the bucket (a
proxying server says which in its answer): at once for a missing bucket, after about 20 s
(two reads of 10 s, measured) against a server that accepts and never answers. Without them a missing bucket
behind a proxying server cost minutes per file: the server answers 500 to the upload and
MLflow's client retries a 500 seven times with backoff (measured: 277 s for one config.json,
then an error that names neither the bucket nor the cause).

What it does not: upload anything, create buckets (deploy/compose.yml's `buckets` service
does), or check a local (file://) store, whose errors are immediate.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from mlflow.exceptions import MlflowException

from rlpipe.core.errors import StorageUnavailable

ARTIFACT_CHECK_CONNECT_S = 5.0
ARTIFACT_CHECK_READ_S = 10.0
"""The bounds of the one request that checks a run's artifact store before its first upload."""
ARTIFACTS_PROXY_PATH = "/mlflow-artifacts/artifacts"  # an MLflow server's artifact proxy, under /api/2.0


def bucket_of(root: str) -> str:
    """The bucket of an s3:// URI: s3://mlflow/artifacts/1 -> mlflow."""
    return urlsplit(root).netloc


def check_s3_bucket(root: str) -> None:
    """Raise StorageUnavailable within seconds unless the bucket of the s3:// URI `root` answers
    a HEAD at MLFLOW_S3_ENDPOINT_URL (where MLflow's S3 artifact repository uploads)."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, endpoint = bucket_of(root), os.environ.get("MLFLOW_S3_ENDPOINT_URL") or None
    where = endpoint or "AWS S3"
    ignore_tls = os.environ.get("MLFLOW_S3_IGNORE_TLS", "").lower() in ("1", "true")
    config = Config(connect_timeout=ARTIFACT_CHECK_CONNECT_S, read_timeout=ARTIFACT_CHECK_READ_S,
                    retries={"max_attempts": 2, "mode": "standard"})
    client = boto3.client("s3", endpoint_url=endpoint, config=config, verify=False if ignore_tls else None)
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise StorageUnavailable(
                f"MLflow's artifact bucket {bucket!r} does not exist at {where} (artifact root {root})",
                hint=f"create the bucket {bucket!r} (deploy/compose.yml's `buckets` service does) or point the "
                     "experiment's artifact location at a bucket that exists",
            ) from exc
        raise StorageUnavailable(
            f"MLflow's artifact bucket {bucket!r} at {where} refused a HEAD: {code or exc}",
            hint="check the AWS keys and the bucket's policy",
        ) from exc
    except BotoCoreError as exc:
        raise StorageUnavailable(
            f"the S3 endpoint {where} of MLflow's artifact bucket {bucket!r} does not answer: {exc}",
            hint="check MLFLOW_S3_ENDPOINT_URL and that the S3 server is up",
        ) from exc


def check_proxied_store(root: str, tracking_uri: str) -> None:
    """Raise StorageUnavailable within seconds unless the MLflow server that proxies the
    artifact root `root` (mlflow-artifacts:/...) lists it: the server then reached its own
    artifact store. A server whose bucket is missing answers 404 with a message that names it
    ("Failed to list artifacts in s3://mlflow/artifacts: The specified bucket does not exist");
    other failures answer 500. One retry, a 10 s read bound (MLflow's client retries a 500
    seven times, about 4.5 minutes per file)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    resolved = str(get_artifact_repository(root, tracking_uri=tracking_uri).artifact_uri)
    base, found, tail = resolved.partition(ARTIFACTS_PROXY_PATH)
    if not found:
        return  # not an MLflow server's proxy: nothing of ours to check
    server = base.removesuffix("/api/2.0")
    try:
        response = http_request(
            get_default_host_creds(base), ARTIFACTS_PROXY_PATH, "GET", params={"path": tail.strip("/")},
            max_retries=1, backoff_factor=1, timeout=(ARTIFACT_CHECK_CONNECT_S, ARTIFACT_CHECK_READ_S),
            raise_on_status=False,
        )
    except MlflowException as exc:
        raise StorageUnavailable(
            f"MLflow at {server} did not answer a listing of {root} (2 tries, {ARTIFACT_CHECK_READ_S:.0f} s each): {exc.message}",
            hint="the server or its artifact store (`mlflow server --artifacts-destination`) is down; see the server's log",
        ) from exc
    if response.status_code >= 400:
        try:
            said = str(response.json().get("message") or response.text)
        except ValueError:
            said = response.text.strip()[:300] or response.reason
        raise StorageUnavailable(
            f"MLflow at {server} cannot store artifacts: {said} (HTTP {response.status_code} listing {root})",
            hint="create the bucket of the server's `--artifacts-destination` (deploy/compose.yml: s3://mlflow, made "
                 "by its `buckets` service) and check the server's S3 endpoint (its MLFLOW_S3_ENDPOINT_URL); "
                 "the server's log has the whole error",
        )
