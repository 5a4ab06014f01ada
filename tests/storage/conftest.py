"""Storage fixtures: a moto S3 server as its own process (one per session) and fresh lakes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlpipe.storage.lake import Lake
from tests.helpers.s3_server import start_moto_server

S3_KEYS = {"access_key": "testing", "secret_key": "testing", "region": "us-east-1"}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    endpoint_url, stop = start_moto_server()
    try:
        yield endpoint_url
    finally:
        stop()


@pytest.fixture
def local_lake(tmp_path: Path) -> Lake:
    return Lake.open(str(tmp_path / "lake"))


@pytest.fixture
def s3_lake(s3_endpoint: str) -> Lake:
    """A lake in a new bucket (created by Lake.open) under a prefix, so tests never share."""
    bucket = f"lake-{uuid.uuid4().hex[:12]}"
    return Lake.open(f"s3://{bucket}/some/prefix", endpoint_url=s3_endpoint, **S3_KEYS)
