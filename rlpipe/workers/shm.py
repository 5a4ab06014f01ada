"""Where a run's weight-sync files live: a folder of its own on /dev/shm (workers/weights.py
writes and reads them). Apart from weights.py so that the controller, which only names and
removes the folder, never imports torch."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

SHM = Path("/dev/shm")


def weights_folder(run_id: str) -> Path:
    """/dev/shm/rlpipe-<run id> (the system temp folder where there is no /dev/shm)."""
    base = SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"rlpipe-{re.sub(r'[^A-Za-z0-9._-]', '_', run_id)}"
