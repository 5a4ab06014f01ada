"""Fixtures for CLI tests: a working folder nested deep enough (200+ characters) that any
message wrapped at the console width would break a path printed in it. (S3 tests use the
session's one moto server, tests/conftest.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

NESTING = ("long-folder-name-" + "x" * 33,) * 4  # 4 x 50 characters below tmp_path


@pytest.fixture
def long_tmp(tmp_path: Path) -> Path:
    folder = tmp_path.joinpath(*NESTING)
    folder.mkdir(parents=True)
    assert len(str(folder)) > 200
    return folder
