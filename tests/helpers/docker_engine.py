"""When a docker test may skip: one rule for every test marked `docker`.

A docker test skips only on a machine without docker: no engine answers and nobody said one
was provisioned. It FAILS, saying why, where
- `make test` / `make test-extended` ran (they run `make system`, which installs the docker
  engine and builds the sandbox image, and export RLPIPE_TEST_DOCKER=required to pytest;
  CI's .ci/run runs `make test`): a broken docker backend must not read as skipped there;
- or an engine answers: then a sandbox that cannot start is the backend's failure, not a
  missing docker.

What it does not: install or start docker, or decide anything for bubblewrap (the bwrap
tests keep tests/sandbox/_bwrap_support.py's rule).
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from rlpipe.core.errors import SandboxUnavailable

REQUIRED_VAR = "RLPIPE_TEST_DOCKER"
"""Set to "required" by the Makefile's test targets, where docker was provisioned."""


def docker_required() -> bool:
    return os.environ.get(REQUIRED_VAR) == "required"


def engine_answers() -> bool:
    from rlpipe.sandbox.docker_backend import docker_client

    try:
        docker_client()
    except SandboxUnavailable:
        return False
    return True


def no_docker(why: str) -> NoReturn:
    """The test cannot use docker because of `why`: fail where docker is there or was
    provisioned, else skip."""
    if docker_required():
        pytest.fail(f"docker was provisioned ({REQUIRED_VAR}=required) but {why}", pytrace=False)
    if engine_answers():
        pytest.fail(f"a docker engine answers but {why}", pytrace=False)
    pytest.skip(f"no docker engine: {why}")


def require_docker_engine():  # noqa: ANN201 - a docker.DockerClient (docker is imported lazily)
    """The docker client; without an engine, `no_docker` (skip, or fail where provisioned)."""
    from rlpipe.sandbox.docker_backend import docker_client

    try:
        return docker_client()
    except SandboxUnavailable as exc:
        no_docker(exc.message)
