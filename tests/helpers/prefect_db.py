"""A ready Prefect database (migrated, block types registered, no flow run), made once per
test run and copied wherever the tests start a Prefect server: the session harnesses and the
tests' own temporary servers (ephemeral mode: the CLI's).

A server started on an empty database first migrates it and registers Prefect's block types:
8-13 s of CPU of the ~9-18 s its start costs (measured on the 2-core CI box); ~3.5-5.6 s
with a ready database.

- `ready_harness(shared_folder)`: the session's harness (tests/conftest.py; one per
  pytest-xdist worker). The first worker to need Prefect starts Prefect's harness, which
  migrates its database, and snapshots it into the folder the workers share before any test
  writes to it; the others wait for that file (a file lock) and start theirs on a copy.
- `seed_prefect_home(home, snapshot)`: a copy where a temporary server started with that
  PREFECT_HOME looks for its database.

Not for the tests of a first start itself (`rlpipe up` in tests/cli/test_up_serves_train.py
keeps a new, empty home).
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

import prefect.settings
import prefect.testing.utilities
from filelock import FileLock
from prefect.testing.utilities import prefect_test_harness

SQLITE_PREFIX = "sqlite+aiosqlite:///"
DATABASE_FILE = "prefect.db"  # Prefect's default database: PREFECT_HOME/prefect.db
HARNESS_DATABASE_FILE = "prefect-test.db"  # the harness's database, in the folder it gets from mkdtemp()
READY_DATABASE = "prefect-ready.db"
HARNESS_START_TIMEOUT_S = 120


@contextmanager
def ready_harness(shared_folder: Path) -> Iterator[tuple[str, Path | None]]:
    """Prefect's test harness (a temporary server on a database of its own), on a copy of the
    test run's ready database, which the first caller makes (module docstring). Yields the
    API URL and the ready database (None where it could not be made: a harness then migrates
    its own, as Prefect's does)."""
    ready = shared_folder / READY_DATABASE
    with ExitStack() as stack:
        with FileLock(str(shared_folder / f"{READY_DATABASE}.lock")):
            if ready.is_file():
                stack.enter_context(_harness_on_a_copy_of(ready))
            else:
                stack.enter_context(prefect_test_harness(server_startup_timeout=HARNESS_START_TIMEOUT_S))
                database_url = str(prefect.settings.PREFECT_SERVER_DATABASE_CONNECTION_URL.value())
                made = snapshot_database(database_url, shared_folder / f"{READY_DATABASE}.partial")
                if made is not None:
                    made.replace(ready)  # whole or absent: no worker copies half a database
        yield str(prefect.settings.PREFECT_API_URL.value()), ready if ready.is_file() else None


@contextmanager
def _harness_on_a_copy_of(database: Path) -> Iterator[None]:
    """Prefect's harness, its mkdtemp() folder holding a copy of `database` where it looks."""
    folder = tempfile.mkdtemp(prefix="prefect-harness-")  # the harness removes it at exit
    shutil.copyfile(database, Path(folder) / HARNESS_DATABASE_FILE)
    with ExitStack() as stack:
        with mock.patch.object(prefect.testing.utilities, "mkdtemp", return_value=folder):
            stack.enter_context(prefect_test_harness(server_startup_timeout=HARNESS_START_TIMEOUT_S))
        in_use = str(prefect.settings.PREFECT_SERVER_DATABASE_CONNECTION_URL.value())
        if in_use != SQLITE_PREFIX + str(Path(folder) / HARNESS_DATABASE_FILE):
            raise RuntimeError(f"Prefect's test harness no longer keeps its database at mkdtemp()/"
                               f"{HARNESS_DATABASE_FILE} (it uses {in_use}): update tests/helpers/prefect_db.py")
        yield


def snapshot_database(connection_url: str, into: Path) -> Path | None:
    """A consistent copy (`VACUUM INTO`, safe beside a live server) of the SQLite database at
    `connection_url`; None when the server's database is not a SQLite file or cannot be
    read now (the tests then let their servers make their own)."""
    if not connection_url.startswith(SQLITE_PREFIX):
        return None
    into.parent.mkdir(parents=True, exist_ok=True)
    into.unlink(missing_ok=True)  # VACUUM INTO refuses an existing file
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
