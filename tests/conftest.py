"""Session fixtures shared by test folders: ONE Prefect test harness (a temporary API
server and database) for the whole session. Two nested harnesses in one session split a
flow's records between them (flow runs reach the newer server, task runs may reach the
older), so every folder that needs Prefect requests this fixture instead of starting its own."""

from __future__ import annotations

from collections.abc import Iterator

import prefect.settings
import pytest
from prefect.testing.utilities import prefect_test_harness


@pytest.fixture(scope="session")
def prefect_api_url() -> Iterator[str]:
    """Start the session's Prefect harness on first use; its API URL (for subprocesses)."""
    with prefect_test_harness(server_startup_timeout=120):
        yield str(prefect.settings.PREFECT_API_URL.value())
