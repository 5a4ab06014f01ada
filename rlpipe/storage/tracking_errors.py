"""MLflow's errors as rlpipe's (storage/tracking.py's requests): an unknown run is
RunNotFoundError, a rejected value UserError, anything else from MLflow or the OS
StorageUnavailable; an s3:// artifact store's boto3 errors are StorageUnavailable naming
the bucket. Nothing else here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from mlflow.exceptions import MlflowException

from rlpipe.core.errors import RunNotFoundError, StorageUnavailable, UserError
from rlpipe.storage.artifact_checks import bucket_of


@contextmanager
def tracking_errors(uri: str, action: str) -> Iterator[None]:
    try:
        yield
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"):
            raise RunNotFoundError(
                f"MLflow at {uri}: {action}: {exc.message}",
                hint="the tracking store lacks this run; check tracking.mlflow_uri",
            ) from exc
        if exc.error_code in ("INVALID_PARAMETER_VALUE", "BAD_REQUEST", "MALFORMED_REQUEST"):
            raise UserError(f"MLflow at {uri} rejected {action}: {exc.message}") from exc
        raise StorageUnavailable(
            f"MLflow at {uri}: {action} failed: {exc.message}",
            hint="check that the tracking server is running (`rlpipe up`) or fix tracking.mlflow_uri",
        ) from exc
    except OSError as exc:
        raise StorageUnavailable(
            f"MLflow at {uri}: {action} failed: {exc}",
            hint="check the tracking server or the artifact store",
        ) from exc


@contextmanager
def artifact_errors(uri: str, root: str, action: str) -> Iterator[None]:
    """`tracking_errors`, plus boto3's and botocore's errors (an s3:// artifact root is
    uploaded to by boto3 in this process, whose errors are neither MLflow's nor OSError)."""
    try:
        with tracking_errors(uri, action):
            yield
    except Exception as exc:
        if not type(exc).__module__.startswith(("boto3", "botocore", "s3transfer")):
            raise
        raise StorageUnavailable(
            f"MLflow artifact store {root}: {action} failed: {exc}",
            hint=f"check that the bucket {bucket_of(root)!r} exists and that MLFLOW_S3_ENDPOINT_URL and the AWS keys are right",
        ) from exc
