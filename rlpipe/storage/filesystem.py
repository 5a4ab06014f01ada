"""Open the filesystem that holds a lake: a local folder or s3://bucket/prefix.

What it does: parses the lake URI, resolves S3 settings (arguments first, then the
AWS_ENDPOINT_URL / AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_REGION /
AWS_DEFAULT_REGION environment, then region us-east-1), checks within a few seconds that
the endpoint answers and the keys are accepted, and returns a `LakeLocation`: a pyarrow
FileSystem plus the root path inside it. Opening with `create=True` (what `rlpipe train`
does) makes a missing folder or bucket (with the `minio` client); `create=False` (every
read-only command) creates nothing and raises LakeNotFoundError when there is no lake: no
folder, no bucket, or nothing under the bucket's prefix (S3 has no folders). Errors are
translated: an endpoint that does not answer -> StorageUnavailable; a malformed URI,
endpoint or rejected keys -> ConfigError.

What it does not: read or write lake files (storage/lake.py does), or retry (Prefect retries
InfraErrors at the task level).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow.fs as pafs
import urllib3
from minio import Minio
from minio.error import MinioException, S3Error

from rlpipe.core.errors import ConfigError, LakeNotFoundError, StorageUnavailable

CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 5.0
DEFAULT_REGION = "us-east-1"
_NO_LAKE_HINT = "check the lake URI (storage.lake_uri); the first `rlpipe train` creates a lake"
_CREDENTIAL_ERROR_CODES = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken"}
)


@dataclass(frozen=True)
class S3Settings:
    """Where and how to reach an S3 endpoint. `endpoint_url` None = AWS itself."""

    endpoint_url: str | None
    access_key: str | None
    secret_key: str | None
    region: str

    @property
    def scheme(self) -> str:
        return urlsplit(self.endpoint_url).scheme if self.endpoint_url else "https"

    @property
    def host_port(self) -> str:
        """host:port of the endpoint (s3.amazonaws.com when no endpoint is set)."""
        return urlsplit(self.endpoint_url).netloc if self.endpoint_url else "s3.amazonaws.com"


@dataclass(frozen=True)
class LakeLocation:
    """An opened lake: `filesystem` holds it under `root` ("/abs/dir" or "bucket/prefix").

    `s3` is set for S3 lakes (so DuckDB or others can reach the same objects), else None.
    """

    uri: str
    filesystem: pafs.FileSystem
    root: str
    s3: S3Settings | None

    @property
    def is_local(self) -> bool:
        return self.s3 is None

    def path(self, relative: str) -> str:
        """The filesystem path of a lake-relative path like "runs/r1/run.json"."""
        return f"{self.root}/{relative}" if relative else self.root


def resolve_s3_settings(
    endpoint_url: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    region: str | None = None,
) -> S3Settings:
    """Arguments first, then the AWS_* environment, then region us-east-1."""
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
    if endpoint is not None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(
                f"S3 endpoint {endpoint!r} is not an http(s) URL",
                hint="write it like http://127.0.0.1:9000 (storage.s3_endpoint_url or AWS_ENDPOINT_URL)",
            )
        if parts.path not in ("", "/"):
            raise ConfigError(
                f"S3 endpoint {endpoint!r} has a path ({parts.path!r})",
                hint="give only scheme://host:port; put the prefix in the lake URI s3://bucket/prefix",
            )
        endpoint = f"{parts.scheme}://{parts.netloc}"
    return S3Settings(
        endpoint_url=endpoint,
        access_key=access_key or os.environ.get("AWS_ACCESS_KEY_ID") or None,
        secret_key=secret_key or os.environ.get("AWS_SECRET_ACCESS_KEY") or None,
        region=region
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or DEFAULT_REGION,
    )


def split_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/some/prefix -> ("bucket", "some/prefix"); ConfigError if malformed."""
    parts = urlsplit(uri)
    bucket = parts.netloc
    prefix = parts.path.strip("/")
    if parts.scheme != "s3" or not bucket or parts.query or parts.fragment:
        raise ConfigError(
            f"lake URI {uri!r} is not of the form s3://bucket/prefix",
            hint="use s3://<bucket>[/<prefix>] or a local folder path",
        )
    if not (3 <= len(bucket) <= 63) or bucket.lower() != bucket or "_" in bucket:
        raise ConfigError(
            f"bucket name {bucket!r} in {uri!r} is not a valid S3 bucket name",
            hint="bucket names are 3-63 characters: lower-case letters, digits, '.', '-'",
        )
    return bucket, prefix


def open_lake_location(
    uri: str,
    endpoint_url: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    region: str | None = None,
    create: bool = True,
) -> LakeLocation:
    """Open the lake at `uri` (a folder path, file:// URI or s3://bucket/prefix); make its
    folder or bucket if missing when `create`, else LakeNotFoundError."""
    if "://" not in uri or uri.startswith("file://"):
        return _open_local(uri, create)
    if not uri.startswith("s3://"):
        raise ConfigError(
            f"lake URI {uri!r} has an unsupported scheme",
            hint="use a local folder path or s3://bucket/prefix",
        )
    bucket, prefix = split_s3_uri(uri)
    settings = resolve_s3_settings(endpoint_url, access_key, secret_key, region)
    _ensure_bucket(settings, bucket, prefix, uri, create)
    filesystem = pafs.S3FileSystem(
        access_key=settings.access_key,
        secret_key=settings.secret_key,
        region=settings.region,
        endpoint_override=settings.host_port if settings.endpoint_url else None,
        scheme=settings.scheme,
        connect_timeout=CONNECT_TIMEOUT_S,
        request_timeout=READ_TIMEOUT_S,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=3),
    )
    root = f"{bucket}/{prefix}" if prefix else bucket
    return LakeLocation(uri=uri, filesystem=filesystem, root=root, s3=settings)


def _open_local(uri: str, create: bool) -> LakeLocation:
    path = Path(urlsplit(uri).path if uri.startswith("file://") else uri).expanduser().resolve()
    if not create:
        if not path.is_dir():
            raise LakeNotFoundError(f"no lake at {path}: the folder does not exist", hint=_NO_LAKE_HINT)
        return LakeLocation(uri=str(path), filesystem=pafs.LocalFileSystem(), root=str(path), s3=None)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageUnavailable(
            f"cannot create the lake folder {path}: {exc.strerror}",
            hint="check the path and its permissions (storage.lake_uri)",
        ) from exc
    return LakeLocation(uri=str(path), filesystem=pafs.LocalFileSystem(), root=str(path), s3=None)


def minio_client(settings: S3Settings) -> Minio:
    """A minio client with short timeouts and no retries (fail fast; Prefect retries)."""
    http_client = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S),
        retries=urllib3.Retry(total=0, connect=0, read=0, redirect=0),
    )
    return Minio(
        settings.host_port,
        access_key=settings.access_key,
        secret_key=settings.secret_key,
        secure=settings.scheme == "https",
        region=settings.region,
        http_client=http_client,
    )


def _ensure_bucket(settings: S3Settings, bucket: str, prefix: str, uri: str, create: bool) -> None:
    """Check reachability and keys with one request; create the bucket if missing and
    `create`, else LakeNotFoundError when the bucket, or anything under the prefix, is missing."""
    client = minio_client(settings)
    endpoint = settings.endpoint_url or "https://s3.amazonaws.com"
    try:
        if not client.bucket_exists(bucket):
            if not create:
                raise LakeNotFoundError(f"no lake at {uri}: bucket {bucket!r} does not exist at {endpoint}", hint=_NO_LAKE_HINT)
            client.make_bucket(bucket)
        elif not create and prefix and next(iter(client.list_objects(bucket, prefix=f"{prefix}/")), None) is None:
            raise LakeNotFoundError(f"no lake at {uri}: nothing is stored under {prefix!r} in bucket {bucket!r}", hint=_NO_LAKE_HINT)
    except S3Error as exc:
        if exc.code in _CREDENTIAL_ERROR_CODES:
            raise ConfigError(
                f"S3 endpoint {endpoint} rejected the keys for bucket {bucket!r}: {exc.code}",
                hint="check storage.s3_access_key/s3_secret_key or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
            ) from exc
        if exc.code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            return  # another process created it between our two calls
        raise StorageUnavailable(
            f"S3 endpoint {endpoint} failed on bucket {bucket!r}: {exc.code} {exc.message}",
            hint="check the endpoint's logs; the step will be retried",
        ) from exc
    except MinioException as exc:  # a non-S3 answer (proxy page, 5xx without XML body)
        raise StorageUnavailable(
            f"S3 endpoint {endpoint} gave an unexpected answer: {exc}",
            hint="check that the endpoint is an S3 server (MinIO, AWS) and is healthy",
        ) from exc
    except ValueError as exc:  # minio rejects malformed bucket names and endpoints this way
        raise ConfigError(f"bad S3 settings for {endpoint}: {exc}", hint="check storage.*") from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise StorageUnavailable(
            f"S3 endpoint {endpoint} is unreachable ({type(exc).__name__})",
            hint="start it (`docker compose -f deploy/compose.yml up -d minio`) or fix "
            "storage.s3_endpoint_url / AWS_ENDPOINT_URL",
        ) from exc
