"""One process at a time writes a run: `hold_run(location, run_id)` before a run's workers
start, `RunHold.release()` after they stopped.

Two `rlpipe train` (or `resume`, or a Prefect retry) of one run id at once would both commit
steps, write checkpoints and move status.json: the second is refused with RunInUse (exit 2,
one line naming the holder) before it spawns anything.

- A local lake: an exclusive `flock` on `<lake>/locks/<run_id>.lock`. The kernel releases it
  when the holding process ends, however it ends (kill -9 included), so a resume right after a
  crash is never refused. The file stays (a few bytes); it records who holds it, for the
  message.
- An S3 lake: a lease, the object `locks/<run_id>.json` (owner token, pid, host, when it was
  last renewed), renewed every `renew_s` by a daemon thread and deleted on release. A start
  that finds a lease watches it: renewed within `ttl_s`, the holder lives (refused); not
  renewed for `ttl_s`, its holder died (kill -9 leaves a lease) and the lease is taken over.
  Liveness is judged by the lease changing, never by comparing clocks of two machines. Two
  starts at the same moment: each writes its lease, waits, reads it back; the one that no
  longer finds its own token refuses (S3 reads after writes are consistent).

What it does not: fence a holder that stalled past `ttl_s` and woke up (S3 through pyarrow has
no conditional write), or lock runs against readers (`rlpipe query`, `runs show`, export).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from rlpipe.core.errors import UserError
from rlpipe.storage.filesystem import LakeLocation
from rlpipe.storage.objects import storage_errors

log = logging.getLogger(__name__)

LOCKS = "locks"
LEASE_TTL_S = 30.0
"""An S3 lease not renewed for this long is a dead holder's."""
LEASE_RENEW_S = 10.0
CONFIRM_S = 1.0
"""How long two simultaneous S3 starts wait before reading their lease back."""


class RunInUse(UserError):
    """Another process is writing this run."""


@dataclass(eq=False)
class RunHold:
    """A run held by this process; `release()` once its workers stopped (idempotent)."""

    run_id: str
    _release: object = field(repr=False)  # Callable[[], None]
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._release()  # type: ignore[operator]


def hold_run(location: LakeLocation, run_id: str, ttl_s: float = LEASE_TTL_S, renew_s: float = LEASE_RENEW_S) -> RunHold:
    """Take the run for this process, or raise RunInUse naming the holder."""
    with storage_errors(f"taking run {run_id}'s lock", location):
        if location.is_local:
            return _hold_local(Path(location.path(f"{LOCKS}/{run_id}.lock")), run_id)
        return _S3Lease(location, run_id, ttl_s, renew_s).take()


def run_is_held(location: LakeLocation, run_id: str) -> bool:
    """Whether some process holds the run now (a run whose status says running but that no
    process holds was killed). Local: the flock is tried, shared and without waiting; S3: a
    lease object exists (a killed holder's lease counts until a start takes it over)."""
    with storage_errors(f"reading run {run_id}'s lock", location):
        if not location.is_local:
            return location.filesystem.get_file_info(location.path(f"{LOCKS}/{run_id}.json")).type != pafs.FileType.NotFound
        path = Path(location.path(f"{LOCKS}/{run_id}.lock"))
        try:
            handle = open(path)  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return False
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    return True
                raise
            fcntl.flock(handle, fcntl.LOCK_UN)
            return False


def _holder() -> dict[str, object]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since_ms": int(time.time() * 1000)}


def _in_use(run_id: str, holder: dict[str, object]) -> RunInUse:
    who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}" if holder else "another process"
    return RunInUse(f"run {run_id} is being written by another rlpipe process ({who})",
                    hint="wait for it to end or stop it (`rlpipe runs show` says where it is); a run is resumed by one "
                         "command at a time")


def _hold_local(path: Path, run_id: str) -> RunHold:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")  # noqa: SIM115 - held open for the run's life: the lock lives with it
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.seek(0)
        text = handle.read()
        handle.close()
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        try:
            holder = json.loads(text)
        except ValueError:
            holder = {}
        raise _in_use(run_id, holder) from None
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps(_holder()))
    handle.flush()

    def release() -> None:
        handle.close()  # closing the file releases the flock

    return RunHold(run_id, release)


class _S3Lease:
    def __init__(self, location: LakeLocation, run_id: str, ttl_s: float, renew_s: float) -> None:
        self.fs = location.filesystem
        self.path = location.path(f"{LOCKS}/{run_id}.json")
        self.run_id = run_id
        self.ttl_s, self.renew_s = ttl_s, renew_s
        self.token = uuid.uuid4().hex
        self.stop = threading.Event()
        self.renewing: threading.Thread | None = None

    def _read(self) -> dict[str, object] | None:
        try:
            with self.fs.open_input_stream(self.path) as stream:
                return json.loads(stream.read())
        except FileNotFoundError:
            return None
        except ValueError:  # a torn or foreign object: treat as a lease nobody renews
            return {}

    def _write(self) -> None:
        lease = {"owner": self.token, **_holder(), "renewed": uuid.uuid4().hex}
        self.fs.create_dir(self.path.rsplit("/", 1)[0], recursive=True)
        with self.fs.open_output_stream(self.path) as stream:
            stream.write(json.dumps(lease).encode())

    def take(self) -> RunHold:
        found = self._read()
        if found is not None:
            self._wait_for_a_dead_holder(found)
        self._write()
        time.sleep(CONFIRM_S)  # a simultaneous start's write lands in this window, or after our read
        now = self._read()
        if not now or now.get("owner") != self.token:
            raise _in_use(self.run_id, now or {})
        self.renewing = threading.Thread(target=self._renew, name=f"rlpipe-lease-{self.run_id}", daemon=True)
        self.renewing.start()
        return RunHold(self.run_id, self._release)

    def _wait_for_a_dead_holder(self, found: dict[str, object]) -> None:
        """Raise RunInUse as soon as the lease changes (its holder renews it); return once it
        stayed unchanged for ttl_s or was deleted (the holder ended)."""
        log.warning("run %s has a lease (pid %s on %s): waiting up to %.0f s to see whether its holder lives",
                    self.run_id, found.get("pid", "?"), found.get("host", "?"), self.ttl_s)
        deadline = time.monotonic() + self.ttl_s
        while time.monotonic() < deadline:
            time.sleep(min(1.0, self.renew_s / 4))
            now = self._read()
            if now is None:
                return
            if now != found:
                raise _in_use(self.run_id, now)

    def _renew(self) -> None:
        while not self.stop.wait(self.renew_s):
            try:
                self._write()
            except (OSError, pa.ArrowException) as exc:  # an outage: the next tick tries again; the run goes on
                log.warning("could not renew run %s's lease: %s", self.run_id, exc)

    def _release(self) -> None:
        self.stop.set()
        if self.renewing is not None:
            self.renewing.join(timeout=self.renew_s)  # a renewal in flight must not land after the delete
        try:
            if (self._read() or {}).get("owner") == self.token:
                self.fs.delete_file(self.path)
        except (OSError, pa.ArrowException) as exc:
            log.warning("could not delete run %s's lease (the next start waits %.0f s for it): %s",
                        self.run_id, self.ttl_s, exc)
