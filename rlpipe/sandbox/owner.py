"""Which process owns a sandbox resource, and whether that process still runs (Linux /proc).

An owner is a pid plus the process's start time (field 22 of /proc/PID/stat, in clock
ticks since boot): a pid alone is reused after its process dies, the pair is not (until a
reboot). The bubblewrap backend writes the pair into each sandbox dir's `owner` file, the
docker backend into each container's labels; their reapers remove what a gone owner left.

What it does not do: look at processes of another pid namespace or host (a pid is only
meaningful where it was read; callers compare the host name first), or remove anything.
"""

from __future__ import annotations

import os
from pathlib import Path


def start_ticks(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot, as /proc writes it; None if it does not run."""
    try:
        stat_text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return stat_text.rsplit(")", 1)[1].split()[19]  # the name may hold spaces and ')': split after the last ')'


def this_process() -> tuple[int, str]:
    """(pid, start ticks) of the calling process."""
    pid = os.getpid()
    ticks = start_ticks(pid)
    assert ticks is not None  # this process runs
    return pid, ticks


def process_alive(pid: int, ticks: str | None = None) -> bool:
    """Whether process `pid` runs and, when `ticks` is given, is the one that started then."""
    if pid <= 0:
        return False
    now = start_ticks(pid)
    if now is None:
        return False
    return ticks is None or now == ticks
