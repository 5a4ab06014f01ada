"""Processes found by a marker in their environment: what a test started, however deep
(workers, torchrun and its ranks, which run in sessions of their own and outlive a parent
that dies), and nothing another test running beside it started.

A worker forked from the session's shared zygote (tests/conftest.py) shows the zygote's
environment in /proc/PID/environ, not its controller's, so no marker finds it. A test that
finds processes by a marker either gives the processes it marks `own_zygote_env` (their
workers come from the controller's own zygote, started with the marker; `processes_marked`
refuses to answer for a marked process that could still use the shared one), or counts the
shared zygote's workers beside the marked processes: `shared_zygote_workers` lists them (the
zygote serves this pytest process's tests only, one test at a time), so the workers that a
test's runs forked there are those not listed before the runs began."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from rlpipe.workers.launch import SHARED_ZYGOTE_ENV_VAR


def own_zygote_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the shared zygote's socket: workers fork from their controller's own
    zygote, whose environment (the marker included) /proc shows for them."""
    return {key: value for key, value in env.items() if key != SHARED_ZYGOTE_ENV_VAR}


def processes_marked(name: str, value: str, shared_zygote_counted: bool = False) -> list[int]:
    """Pids of live (not zombie) processes whose environment holds `name=value`. Raises
    AssertionError for one that names the shared zygote (its workers would not be found),
    unless the caller counts that zygote's workers itself (`shared_zygote_counted`)."""
    wanted = f"{name}={value}".encode()
    shared = f"{SHARED_ZYGOTE_ENV_VAR}=".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            if wanted not in environ:
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        assert shared_zygote_counted or not any(item.startswith(shared) and item != shared for item in environ), (
            f"process {entry.name}, marked {name}, may fork workers from the shared zygote, which carry no "
            f"marker: start it with tests.helpers.processes.own_zygote_env")
        found.append(int(entry.name))
    return found


def shared_zygote_workers() -> set[int]:
    """Pids of the live workers forked by this process's shared zygote (RLPIPE_ZYGOTE_SOCKET):
    they keep its command line, which names the socket, and are named rlpipe-engine or
    rlpipe-trainer (workers/zygote.py); empty without a shared zygote."""
    path = os.environ.get(SHARED_ZYGOTE_ENV_VAR, "").strip()
    if not path:
        return set()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
            if b"rlpipe.workers.zygote" not in arguments or path.encode() not in arguments:
                continue
            named = (entry / "comm").read_text().strip()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if named.startswith("rlpipe-") and state != "Z":
            found.add(int(entry.name))
    return found


def is_zygote(pid: int) -> bool:
    """Whether `pid` is a controller's zygote (workers/zygote.py): it lives as long as the
    controller's worker clients, not as long as one worker or group. The workers it forked
    keep its command line but are named rlpipe-engine / rlpipe-trainer."""
    try:
        forked_from_zygote = b"rlpipe.workers.zygote" in Path(f"/proc/{pid}/cmdline").read_bytes()
        return forked_from_zygote and not Path(f"/proc/{pid}/comm").read_text().startswith("rlpipe-")
    except OSError:
        return False
