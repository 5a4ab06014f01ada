"""Checkpoints written in the background, off the trainer's critical path.

`CheckpointWriter.save` gathers what the checkpoint holds as references to the trainer's
live tensors (rl/checkpoint_contents.py: no copy of the weights or the AdamW state; it waits
for the write before it, so at most one is in flight) and hands them to a thread that writes
the folder straight into the lake (storage/checkpoint_store.py: digested as written, no
temporary copy), commits it (CHECKPOINT.json, then LATEST), drops its references and then
applies the run's retention (storage/checkpoint_retention.py: older checkpoints are deleted
only after this one is committed). `save` returns at once: the next step's generation and
forward/backward go on while the files are written, but NOTHING may change the weights or
the optimizer state in place until `join` returns; the trainer worker makes `join` its
Trainer's `before_state_change` hook (rl/trainer.py: every optimizer step, a state load, a
rank sync) and calls it before a warm start and a restore (workers/trainer_worker.py), so
the files hold the state of the step they name; the seconds it blocked there are what the
checkpoint cost the step's critical path (`take_waited_s`: the trainer worker reports them
as time/checkpoint_wait_s). With `wait=True` (checkpoint 0 and the run's last) `save`
returns once the checkpoint is committed.

A write that fails (a full disk: DiskFull; an S3 outage: StorageUnavailable) deletes its
partial folder and is re-raised by the next `save` or `wait` (not by `join`), once: the
checkpoint task that gets it fails (DiskFull) or is retried (StorageUnavailable; its retry
saves the step it was asked for). A kill during the write leaves a folder without
CHECKPOINT.json that nothing reads; `remove_partial` (called by the trainer's restore and
before each save) deletes it.

What it does not: decide when to checkpoint (flows/), load checkpoints (trainer_worker.py),
or stop the trainer from changing its state (its callers wait through `join`).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from dataclasses import dataclass

from rlpipe.core.errors import RlpipeError
from rlpipe.rl.checkpoint_contents import CheckpointContents, CheckpointMeta, ContentsGatherer, write_contents
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
        self._gatherer = ContentsGatherer()
        self._thread: threading.Thread | None = None
        self._state_free = threading.Event()  # set while no write reads the trainer's tensors
        self._state_free.set()
        self._failure: WriteFailure | None = None
        self._waited_s = 0.0  # blocked in `join` by a write, since the last take_waited_s

    def save(self, model, tokenizer, trainer_state: dict, meta: CheckpointMeta, wait: bool = False) -> None:
        """Gather the live state now, write it in the background (see the module docstring):
        the caller changes none of it until `join`. A step that has a complete checkpoint
        already keeps it (a retried save)."""
        self.wait()
        store = self.lake.checkpoints
        if store.is_complete(self.run_id, meta.step):  # the final save after an evaluation: retention again
            store.advance_latest(self.run_id, meta.step)
            self._prune()
            return
        store.remove_partial(self.run_id)
        contents = self._gatherer.gather(model, tokenizer, trainer_state, meta)
        self._state_free = threading.Event()
        self._thread = threading.Thread(target=self._write, args=([contents], self._state_free),
                                        name=f"checkpoint-{meta.step}", daemon=True)
        del contents
        self._thread.start()
        if wait:
            self.wait()

    def join(self) -> None:
        """Return once no write reads the trainer's tensors any more (its files are written or
        it failed; the commit and retention may still run): the state may change then. A
        failed write's error stays for the next `save` or `wait`, so that the checkpoint's
        task reports it."""
        if not self._state_free.is_set():
            began = time.monotonic()
            self._state_free.wait()
            self._waited_s += time.monotonic() - began

    def take_waited_s(self) -> float:
        """Seconds `join` blocked on a write since the last call (what checkpoints cost the
        caller's critical path), and start counting again."""
        waited, self._waited_s = self._waited_s, 0.0
        return waited

    def wait(self) -> None:
        """Return once no write is in flight (committed or failed); raise the error of a
        write that failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        failure, self._failure = self._failure, None
        if failure is None:
            return
        if isinstance(failure.error, RlpipeError):
            raise failure.error
        raise RuntimeError(f"checkpoint {failure.step} of run {self.run_id} could not be written: {failure.error}") from failure.error

    def _write(self, held: list[CheckpointContents], state_free: threading.Event) -> None:
        contents = held.pop()  # the only reference: dropped once the files are written
        step = contents.meta.step
        writing = None
        try:
            try:
                writing = self.lake.checkpoints.begin(self.run_id, step)
                write_contents(contents, writing.open)
            finally:
                del contents
                state_free.set()
            writing.commit()
        except BaseException as exc:  # noqa: BLE001 - handed to the next save or wait
            log.warning("checkpoint %d of run %s was not written: %s", step, self.run_id, exc)
            if writing is not None:
                writing.abort()
            traceback.clear_frames(exc.__traceback__)  # the frames that wrote it hold the contents
            self._failure = WriteFailure(step, exc)
            return
        self._prune()

    def _prune(self) -> None:
        try:
            removed = prune_checkpoints(self.lake, self.run_id, self.retention)
        except Exception as exc:  # noqa: BLE001 - a checkpoint kept too long is no failure
            log.warning("retention of run %s's checkpoints failed (they are kept): %s", self.run_id, exc)
            return
        if removed:
            log.info("run %s: checkpoints %s deleted (retention)", self.run_id, removed)
