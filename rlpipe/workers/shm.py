"""Where a run's weight-sync files live: a private folder of its own on /dev/shm
(workers/weights.py writes and reads them). Apart from weights.py so that the controller,
which only creates and removes the folder, never imports torch.

`create_weights_folder(run_id)` makes /dev/shm/rlpipe-<run id>-<random> with mode 0700
(tempfile.mkdtemp): another user can neither read the weights nor, by creating a folder of
the run's name first, block or hijack the run. The caller records the path it returns
(Runtime.weights_folder, WorkerSpec.weights_folder) and everything finds the folder there;
nothing recomputes the name. A folder left by a killed controller is removed by its
workers' owner watchdog (workers/server.py).

What it does not: pick the files' names inside the folder (weights.py) or remove it (the
Runtime's close, or the watchdog).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

SHM = Path("/dev/shm")


def shm_base() -> Path:
    """/dev/shm, or the system temp folder where there is no writable /dev/shm."""
    return SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else Path(tempfile.gettempdir())


def folder_prefix(run_id: str) -> str:
    """The start of the run's folder name, for an observer outside the run (benchmarks/scale.py)."""
    return f"rlpipe-{re.sub(r'[^A-Za-z0-9._-]', '_', run_id)}-"


def create_weights_folder(run_id: str) -> Path:
    """A new, empty folder for the run's weight files, mode 0700, under a random name."""
    return Path(tempfile.mkdtemp(prefix=folder_prefix(run_id), dir=shm_base()))
