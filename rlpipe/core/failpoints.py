"""Named crash points, for crash-recovery tests: kill -9 at a chosen moment.

    RLPIPE_FAILPOINTS="verify@2,part-write"

makes the process SIGKILL itself the 2nd time it reaches `failpoint("verify")`, and the
1st time it reaches `failpoint("part-write")`. Without the variable a failpoint is one
dict lookup. Points in the code: generate, verify, update (weights changed in memory,
policy version not yet advanced), part-write (half a Parquet part written), checkpoint-write
(some checkpoint files uploaded, CHECKPOINT.json and LATEST not), eval-trial-committed (an
agent eval's trial attempt just committed: agents/recording.py), eval-part-write (half a
Parquet part of an eval trial written).

A worker process of the run (rlpipe/workers/) calls `die_with(owner_pid)` at start: a crash
point hit in a worker then SIGKILLs the owner (the controller) first, so the whole run dies
as it did when everything ran in one process. `failpoint(name, whole_run=False)` kills only
the calling process: points `engine-generate` and `trainer-update` kill just that worker
(tests of a worker that dies mid-run). A restarted worker is started without
RLPIPE_FAILPOINTS (its hit counts would start again from zero).

`name@n:enospc` raises OSError(ENOSPC) there instead of killing (a disk that fills at that
write; the storage layer turns it into DiskFull).

This is how the kill tests hit the middle of a stage reliably; a crash of the real world
(OOM killer, power cut, a pre-empted VM) lands anywhere, and the tests cover each region.
"""

from __future__ import annotations

import errno
import os
import signal

ENV_VAR = "RLPIPE_FAILPOINTS"
_hits: dict[str, int] = {}
_run_pids: list[int] = []  # other processes of the run that a whole-run crash point kills first


def die_with(pid: int) -> None:
    """A whole-run crash point hit in this process SIGKILLs `pid` too (before this process)."""
    _run_pids.append(pid)


def _armed() -> dict[str, tuple[int, str]]:
    """name -> (the hit it acts on, "kill" or "enospc")."""
    spec = os.environ.get(ENV_VAR, "")
    armed: dict[str, tuple[int, str]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        item, _, action = item.partition(":")
        name, _, nth = item.partition("@")
        armed[name] = (int(nth) if nth else 1, action or "kill")
    return armed


def failpoint(name: str, whole_run: bool = True) -> None:
    """SIGKILL this process (and, if `whole_run`, the processes of `die_with`) if `name` is
    armed for this hit."""
    if ENV_VAR not in os.environ:
        return
    armed = _armed().get(name)
    if armed is None:
        return
    nth, action = armed
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == nth and action == "enospc":
        raise OSError(errno.ENOSPC, f"No space left on device (failpoint {name})")
    if _hits[name] == nth:
        for pid in _run_pids if whole_run else ():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.kill(os.getpid(), signal.SIGKILL)
