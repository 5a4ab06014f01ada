"""Shared skip logic for the bubblewrap tests: skip cleanly where bwrap cannot build namespaces."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def bwrap_unavailable_reason() -> str:
    from rlpipe.sandbox.bwrap import bwrap_available

    return bwrap_available()


def require_bwrap() -> None:
    reason = bwrap_unavailable_reason()
    if reason:
        pytest.skip(f"bubblewrap cannot create sandboxes here: {reason}")
