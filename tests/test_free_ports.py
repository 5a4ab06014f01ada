"""The tests' servers get ports the kernel never hands to a client (tests/helpers/ports.py)."""

from __future__ import annotations

import socket

from tests.helpers.ports import LOWEST, _ephemeral_start, free_port


def test_free_ports_lie_below_the_ephemeral_range_and_can_be_bound(monkeypatch) -> None:
    for worker in ("gw0", "gw3", "gw11"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        port = free_port()
        assert LOWEST <= port < _ephemeral_start()
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))


def test_two_xdist_workers_draw_from_disjoint_slices(monkeypatch) -> None:
    drawn = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        drawn[worker] = {free_port() for _ in range(20)}
    assert max(drawn["gw0"]) < min(drawn["gw1"])
