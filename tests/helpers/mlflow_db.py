"""A ready MLflow SQLite database (migrated, no experiment of ours, no run) for the small runs
of the tests.

MLflow migrates a new SQLite store with alembic on first use: ~1.5 s of CPU in every run that
starts on an empty mlflow.db (measured: 1.4-1.6 s fresh, 0.1 s on a copy of a migrated file).
`seed_mlflow_db` copies a template made once per test process instead. What MLflow records
is unchanged: the run still creates its own experiment (with its artifact location) and run
in its own file. tests/storage/test_tracking.py and the learning test keep starting on empty
stores, so a first start stays tested.
"""

from __future__ import annotations

import atexit
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

_lock = threading.Lock()
_template: Path | None = None


def _migrated_template() -> Path:
    global _template
    with _lock:
        if _template is None:
            from mlflow.tracking import MlflowClient

            folder = Path(tempfile.mkdtemp(prefix="rlpipe-mlflow-template-"))
            atexit.register(shutil.rmtree, folder, True)
            path = folder / "mlflow.db"
            MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()  # creates and migrates it
            _template = path
        return _template


def seed_mlflow_db(path: Path) -> None:
    """Put a migrated, empty MLflow database at `path`, unless a file is there already (a
    run's own store is never replaced). MLflow's Default experiment (unused by rlpipe, which
    logs to an experiment of its own) points at `path`'s folder, as if made there."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_migrated_template(), path)
    with sqlite3.connect(path) as db:
        db.execute("update experiments set artifact_location = ? where experiment_id = 0", (str(path.parent / "mlruns" / "0"),))
