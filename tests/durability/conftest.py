"""Fixtures for durability tests: one Prefect API server for the session (Prefect's test
harness; CLI subprocesses reach it through PREFECT_API_URL) and a moto S3 server."""

from __future__ import annotations

from collections.abc import Iterator

import prefect.settings
import pytest
from prefect.testing.utilities import prefect_test_harness

from tests.helpers.s3_server import start_moto_server


@pytest.fixture(scope="session", autouse=True)
def prefect_api_url() -> Iterator[str]:
    with prefect_test_harness(server_startup_timeout=120):
        yield str(prefect.settings.PREFECT_API_URL.value())


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    endpoint_url, stop = start_moto_server()
    try:
        yield endpoint_url
    finally:
        stop()
