"""Fixtures for durability tests: the session's Prefect API server (tests/conftest.py; CLI
subprocesses reach it through PREFECT_API_URL) and a moto S3 server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.s3_server import start_moto_server


@pytest.fixture(scope="session", autouse=True)
def _prefect_server(prefect_api_url: str) -> str:
    return prefect_api_url


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    endpoint_url, stop = start_moto_server()
    try:
        yield endpoint_url
    finally:
        stop()
