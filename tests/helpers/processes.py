"""Processes found by a marker in their environment: what a test started, however deep
(workers, torchrun and its ranks, which run in sessions of their own and outlive a parent
that dies), and nothing another test running beside it started."""

from __future__ import annotations

from pathlib import Path


def processes_marked(name: str, value: str) -> list[int]:
    """Pids of live (not zombie) processes whose environment holds `name=value`."""
    wanted = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if wanted not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry.name))
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
