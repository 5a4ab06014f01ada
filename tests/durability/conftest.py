"""Fixtures for durability tests: the session's Prefect API server (tests/conftest.py; CLI
subprocesses reach it through PREFECT_API_URL). The moto S3 server is the session's one,
`s3_endpoint` in tests/conftest.py."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _prefect_server(prefect_api_url: str) -> str:
    return prefect_api_url
