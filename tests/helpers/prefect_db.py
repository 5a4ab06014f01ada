"""A ready Prefect database (migrated, block types registered, no flow run) for tests that
start a Prefect server of their own (ephemeral mode: the CLI's temporary server).

A server started on an empty PREFECT_HOME first migrates a new SQLite database and registers
Prefect's block types: ~13 s of CPU of the ~18 s its start costs (measured on the 2-core CI
box; ~5.6 s with a ready database). The session's test harness does that work anyway, so
tests/conftest.py snapshots the harness's database as soon as the harness is up, before any
test writes to it, and `seed_prefect_home` copies the snapshot into a test's PREFECT_HOME.

Not for the tests of a first start itself (`rlpipe up` in tests/cli/test_up_serves_train.py
keeps a new, empty home).
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

SQLITE_PREFIX = "sqlite+aiosqlite:///"
DATABASE_FILE = "prefect.db"  # Prefect's default database: PREFECT_HOME/prefect.db


def snapshot_database(connection_url: str, into: Path) -> Path | None:
    """A consistent copy (`VACUUM INTO`, safe beside a live server) of the SQLite database at
    `connection_url`; None when the server's database is not a SQLite file or cannot be
    read now (the tests then let their servers make their own)."""
    if not connection_url.startswith(SQLITE_PREFIX):
        return None
    into.parent.mkdir(parents=True, exist_ok=True)
    try:
        with sqlite3.connect(connection_url.removeprefix(SQLITE_PREFIX), timeout=30) as db:
            db.execute("VACUUM INTO ?", (str(into),))
    except sqlite3.Error:
        into.unlink(missing_ok=True)
        return None
    return into


def seed_prefect_home(prefect_home: Path, snapshot: Path | None) -> None:
    """Put a copy of `snapshot` where a temporary server started with this PREFECT_HOME looks
    for its database (nothing when there is no snapshot: the server then makes its own)."""
    prefect_home.mkdir(parents=True, exist_ok=True)
    if snapshot is not None:
        shutil.copyfile(snapshot, prefect_home / DATABASE_FILE)
