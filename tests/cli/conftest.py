"""Fixtures for CLI tests: a working folder nested deep enough (200+ characters) that any
message wrapped at the console width would break a path printed in it, and a moto S3 server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.s3_server import start_moto_server

NESTING = ("long-folder-name-" + "x" * 33,) * 4  # 4 x 50 characters below tmp_path


@pytest.fixture
def long_tmp(tmp_path: Path) -> Path:
    folder = tmp_path.joinpath(*NESTING)
    folder.mkdir(parents=True)
    assert len(str(folder)) > 200
    return folder


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    endpoint_url, stop = start_moto_server()
    try:
        yield endpoint_url
    finally:
        stop()
