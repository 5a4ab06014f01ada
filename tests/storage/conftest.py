"""Storage fixtures: fresh lakes, local or in a bucket of their own on the session's moto S3
server (`s3_endpoint`, tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpipe.storage.lake import Lake
from tests.helpers.s3_server import unique_bucket

S3_KEYS = {"access_key": "testing", "secret_key": "testing", "region": "us-east-1"}


@pytest.fixture
def local_lake(tmp_path: Path) -> Lake:
    return Lake.open(str(tmp_path / "lake"))


@pytest.fixture
def s3_lake(s3_endpoint: str) -> Lake:
    """A lake in a new bucket (created by Lake.open) under a prefix, so tests never share."""
    return Lake.open(f"s3://{unique_bucket('lake')}/some/prefix", endpoint_url=s3_endpoint, **S3_KEYS)
