"""Checkpoints written in the background, off the trainer's critical path.

`CheckpointWriter.save` takes a snapshot of the trainer's state in host memory
(rl/checkpoint_snapshot.py; it waits for the write before it, so at most one is in flight)
and hands it to a thread that writes the folder
straight into the lake (storage/checkpoint_store.py: digested as written, no temporary copy),
commits it (CHECKPOINT.json, then LATEST), frees the snapshot's memory (written or not: the
trainer does not hold a second copy of its state between checkpoints) and then applies the run's retention
(storage/checkpoint_retention.py: older checkpoints are deleted only after this one is
committed). `save` returns once the snapshot is taken: the next update may change the
weights while the files are written. With `wait=True` (checkpoint 0 and the run's last) it
returns once the checkpoint is committed.

A write that fails (a full disk: DiskFull; an S3 outage: StorageUnavailable) deletes its
partial folder and is re-raised by the next `save` or `wait`, once: the checkpoint task that
gets it fails (DiskFull) or is retried (StorageUnavailable; its retry saves the step it was
asked for). A kill during the write leaves a folder without CHECKPOINT.json that nothing
reads; `remove_partial` (called by the trainer's restore and before each save) deletes it.

What it does not: decide when to checkpoint (flows/), load checkpoints (trainer_worker.py).
"""

from __future__ import annotations

import logging
import threading
import traceback
from dataclasses import dataclass

from rlpipe.core.errors import RlpipeError
from rlpipe.rl.checkpoint_snapshot import CheckpointMeta, CheckpointSnapshot, SnapshotTaker, write_snapshot
from rlpipe.storage.checkpoint_retention import RetentionRule, prune_checkpoints
from rlpipe.storage.lake import Lake

log = logging.getLogger("rlpipe.workers.checkpoint_writer")


@dataclass(frozen=True)
class WriteFailure:
    """A background write that failed: its step and error (re-raised by the next call)."""

    step: int
    error: BaseException


class CheckpointWriter:
    def __init__(self, lake: Lake, run_id: str, retention: RetentionRule) -> None:
        self.lake = lake
        self.run_id = run_id
        self.retention = retention
        self._taker = SnapshotTaker()
        self._thread: threading.Thread | None = None
        self._failure: WriteFailure | None = None

    def save(self, model, tokenizer, trainer_state: dict, meta: CheckpointMeta, wait: bool = False) -> None:
        """Snapshot now, write in the background (see the module docstring). A step that has
        a complete checkpoint already keeps it (a retried save)."""
        self.wait()
        store = self.lake.checkpoints
        if store.is_complete(self.run_id, meta.step):  # the final save after an evaluation: retention again
            store.advance_latest(self.run_id, meta.step)
            self._prune()
            return
        store.remove_partial(self.run_id)
        snapshot = self._taker.take(model, tokenizer, trainer_state, meta)
        self._thread = threading.Thread(target=self._write, args=([snapshot],), name=f"checkpoint-{meta.step}", daemon=True)
        del snapshot
        self._thread.start()
        if wait:
            self.wait()

    def wait(self) -> None:
        """Return once no write is in flight; raise the error of a write that failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        failure, self._failure = self._failure, None
        if failure is None:
            return
        if isinstance(failure.error, RlpipeError):
            raise failure.error
        raise RuntimeError(f"checkpoint {failure.step} of run {self.run_id} could not be written: {failure.error}") from failure.error

    def _write(self, snapshots: list[CheckpointSnapshot]) -> None:
        snapshot = snapshots.pop()  # the only reference: freed when this function returns
        step = snapshot.meta.step
        writing = self.lake.checkpoints.begin(self.run_id, step)
        self._taker.release()
        try:
            write_snapshot(snapshot, writing.open)
            writing.commit()
        except BaseException as exc:  # noqa: BLE001 - handed to the next save or wait
            log.warning("checkpoint %d of run %s was not written: %s", step, self.run_id, exc)
            writing.abort()
            traceback.clear_frames(exc.__traceback__)  # the frames that wrote it hold the snapshot
            self._failure = WriteFailure(step, exc)
            return
        finally:
            del snapshot
        self._prune()

    def _prune(self) -> None:
        try:
            removed = prune_checkpoints(self.lake, self.run_id, self.retention)
        except Exception as exc:  # noqa: BLE001 - a checkpoint kept too long is no failure
            log.warning("retention of run %s's checkpoints failed (they are kept): %s", self.run_id, exc)
            return
        if removed:
            log.info("run %s: checkpoints %s deleted (retention)", self.run_id, removed)
