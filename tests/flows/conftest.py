"""Fixtures for flow tests: Prefect's test harness (a temporary API server and database,
once per session) and a moto S3 server on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.s3_server import start_moto_server


@pytest.fixture(scope="session", autouse=True)
def prefect_harness(prefect_api_url: str) -> Iterator[None]:
    """The session's one Prefect harness (tests/conftest.py), shared with tests/durability."""
    yield


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    endpoint_url, stop = start_moto_server()
    try:
        yield endpoint_url
    finally:
        stop()
