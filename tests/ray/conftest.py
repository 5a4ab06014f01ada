"""A throw-away 2-node Ray cluster for tests/ray (`make test-ray`, in .venv-ray): a head with
2 CPUs and a second node with 1, started and stopped by tests/helpers/ray_cluster.py (only
the processes it started are stopped).

In the main venv (no ray) nothing here is collected: CI never starts a cluster.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

collect_ignore_glob = [] if importlib.util.find_spec("ray") is not None else ["test_*.py"]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """The address (127.0.0.1:port) of a running 2-node Ray cluster."""
    from tests.helpers.ray_cluster import local_ray_cluster

    with local_ray_cluster((2, 1)) as cluster:
        yield cluster.address
