"""Fixtures for flow tests: Prefect's test harness (a temporary API server and database,
once per session, tests/conftest.py). The moto S3 server is the session's one, `s3_endpoint`
in tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def prefect_harness(prefect_api_url: str) -> Iterator[None]:
    """The session's one Prefect harness (tests/conftest.py), shared with tests/durability."""
    yield
