"""The trainer worker's service: the policy, its Trainer (optimizer; reference model when
algo.kl_coef > 0) and the lake. It warm-starts, updates from committed rows it reads from
the lake itself, writes checkpoints into the lake itself in the background
(workers/checkpoint_writer.py: straight from the live tensors, no copy; the next request
goes on, and whatever changes the weights or optimizer state first waits for the write: the
Trainer's `before_state_change` hook before each optimizer step, a state load or a rank
sync, and the warm start and the restore here; checkpoint 0 and the run's last are waited
for), restores from the lake (newest intact
checkpoint + replay of the committed steps after it; partial checkpoint folders a kill left
are deleted first) and publishes its weights.

Every eval.grad_conflict_every_steps steps an update first measures the cosine similarity of
the per-domain policy gradients of the step's rows (rl/grad_conflict.py; the update itself is
unchanged) and returns it with the update's metrics.

Idempotent by policy version: the update of step s turns version s-1 into s; an update of
a step already applied returns at once with no metrics, so a retried call never applies
twice. A request that fails after it began changing the weights (an update or the
warm-start) marks the service poisoned: the worker exits after its reply, and the fresh
worker the controller starts next restores the last good state from the lake.

The warm-start runs rl/warmstart.py in a thread of this worker so that its accuracy checks
can be answered by the controller (which asks the engine worker): at a check the thread
waits for WarmStartContinue. WarmStartWait returns the step losses seen so far.

With cluster.trainer_nproc > 1 this service runs in every rank of the trainer's torchrun
group (workers/trainer_rank.py, `share` its rank), and the trainer worker process itself only
relays (workers/trainer_group.py).

Not here: sockets (server.py), what runs when (tasks/).
"""

from __future__ import annotations

import logging
import os
import queue
import tempfile
import threading
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import torch

from rlpipe.core.config import RunConfig
from rlpipe.core.errors import LakeCorrupted
from rlpipe.core.failpoints import failpoint
from rlpipe.core.seeds import derive_seed
from rlpipe.rl.data_parallel import RankShare
from rlpipe.rl.checkpoint import CheckpointMeta, load_checkpoint, load_policy_weights
from rlpipe.storage.checkpoint_retention import rule_of
from rlpipe.workers.checkpoint_writer import CheckpointWriter
from rlpipe.rl.grad_conflict import gradient_conflict
from rlpipe.rl.samples import TRAIN_COLUMNS, train_samples_from_table
from rlpipe.rl.staleness import split_stale_table, staleness_metrics
from rlpipe.rl.warmstart import warm_start
from rlpipe.workers import weights
from rlpipe.workers.builders import build_policy, build_trainer
from rlpipe.workers.lake_access import build_lake
from rlpipe.workers.protocol import (
    BeginWeightStream,
    Published,
    PublishWeightChunk,
    PublishWeights,
    ResetReference,
    Restore,
    RestoreResult,
    SaveCheckpoint,
    Update,
    UpdateResult,
    WarmStartBegin,
    WarmStartContinue,
    WarmStartState,
    WarmStartWait,
    WeightChunk,
    WeightsDigest,
    WeightStreamPlan,
)

log = logging.getLogger("rlpipe.workers.trainer")


class VersionMismatch(Exception):
    """An update asked of a trainer at another policy version (a bug of the caller)."""


class TrainerService:
    def __init__(self, run_id: str, config: RunConfig, share: RankShare = RankShare()) -> None:
        torch.manual_seed(config.seed)
        self.run_id = run_id
        self.config = config
        policy, self.tokenizer = build_policy(config)
        self.trainer = build_trainer(config, policy, share)  # trainer.model: the policy (its peft wrapper with LoRA)
        self.lake = build_lake(config)
        self.checkpoints = CheckpointWriter(self.lake, run_id, rule_of(config))
        self.trainer.before_state_change = self.checkpoints.join  # a write reads the live state
        self.policy_version = 0
        self.poisoned = False
        self._warm: _WarmStart | None = None
        self.weights_generation = 0  # +1 whenever the weights may change: ends a weight stream
        self._stream: tuple[str, int, list[list[weights.Piece]]] | None = None  # (id, generation, chunks)

    def handle(self, request: Any) -> Any:
        if isinstance(request, Update):
            return self.update(request.step, request.parts, request.shuffle_seed)
        if isinstance(request, PublishWeights):
            path, size = weights.publish(self.trainer.named_weights(), Path(request.folder), self.policy_version)
            return Published(str(path), self.policy_version, size)
        if isinstance(request, BeginWeightStream):
            return self.begin_stream(request.chunk_bytes)
        if isinstance(request, PublishWeightChunk):
            return self.publish_chunk(request.stream_id, request.index, Path(request.folder))
        if isinstance(request, SaveCheckpoint):
            return self.save(request.step, request.config_hash)
        if isinstance(request, Restore):
            return self.restore(request.target_version, request.seed)
        if isinstance(request, WarmStartBegin):
            self.checkpoints.join()  # it trains the weights in place (with its own optimizer, maybe)
            self.weights_generation += 1
            self.poisoned = True  # until it ends well: a half warm-start is no state to go on from
            self._warm = _WarmStart(self, request)
            return None
        if isinstance(request, WarmStartWait):
            state = self._warm_start().wait(request.timeout_s)
            if state.state == "done":
                self._warm, self.poisoned = None, False
            return state
        if isinstance(request, WarmStartContinue):
            self._warm_start().decide(request.stop)
            return None
        if isinstance(request, ResetReference):
            self.trainer.reset_reference()  # the KL anchor is the warm-started policy
            return None
        if isinstance(request, WeightsDigest):
            return weights.digest(self.trainer.named_weights())
        raise ValueError(f"the trainer worker does not serve {type(request).__name__}")

    def begin_stream(self, chunk_bytes: int) -> WeightStreamPlan:
        """Plan the chunks of the current weights (workers/weights.py); the plan is kept until
        the next stream or the next change of the weights."""
        named = list(self.trainer.named_weights())
        chunks = weights.plan_chunks(named, chunk_bytes)
        self._stream = (os.urandom(6).hex(), self.weights_generation, chunks)
        rows = tuple((name, weights.rows_of(tensor)) for name, tensor in named)
        size = sum(tensor.numel() * tensor.element_size() for _, tensor in named)
        return WeightStreamPlan(self._stream[0], self.policy_version, len(chunks), rows, size)

    def publish_chunk(self, stream_id: str, index: int, folder: Path) -> WeightChunk:
        if self._stream is None or self._stream[0] != stream_id:
            raise RuntimeError(f"weight stream {stream_id} is not this trainer's current one (a restarted trainer, or "
                               "a newer stream began); the sync is retried")
        _, generation, chunks = self._stream
        self._check_unchanged(stream_id, generation)
        failpoint("trainer-weight-chunk", whole_run=False)  # tests: the trainer dies mid-stream
        path = folder / f"stream-{stream_id}-{index:05d}.safetensors"
        size = weights.write_chunk(self.trainer.named_weights(), chunks[index], path, self.policy_version)
        try:
            self._check_unchanged(stream_id, generation)  # a warm-start step may have run while it was written
        except RuntimeError:
            path.unlink(missing_ok=True)
            raise
        return WeightChunk(str(path), size)

    def _check_unchanged(self, stream_id: str, generation: int) -> None:
        if generation != self.weights_generation:
            raise RuntimeError(f"the trainer's weights changed during weight stream {stream_id}; the sync is retried")

    def _warm_start(self) -> _WarmStart:
        if self._warm is None:
            raise ValueError("no warm-start is running in this trainer worker")
        return self._warm

    def update(self, step: int, parts: tuple, shuffle_seed: int) -> UpdateResult:
        if self.policy_version >= step:
            return UpdateResult(self.policy_version, {})
        if self.policy_version != step - 1:
            raise VersionMismatch(f"update of step {step} needs policy version {step - 1}, the trainer has {self.policy_version}")
        rows = self.lake.read_parts_table(parts, columns=TRAIN_COLUMNS)  # storage errors leave the weights as they are
        fresh, stale = split_stale_table(rows, step, self.config.rollout.max_staleness)  # never train on staler rows
        samples = train_samples_from_table(fresh)
        conflict = self.gradient_conflict(step, fresh)  # before the update, at its weights; changes nothing
        self.poisoned = True
        self.weights_generation += 1
        metrics = self.trainer.update(samples, shuffle_seed=shuffle_seed)
        failpoint("update")  # weights changed, version not advanced: the whole run dies here
        failpoint("trainer-update", whole_run=False)  # tests: only this worker dies here
        self.policy_version = step
        self.poisoned = False
        result = {f"train/{name}": float(value) for name, value in asdict(metrics).items()}
        result["train/stale_dropped"] = float(stale)
        result["time/checkpoint_wait_s"] = self.checkpoints.take_waited_s()  # inside time/update_s: the write held it
        return UpdateResult(step, {**result, **staleness_metrics(rows.column("policy_version").to_pylist(), step), **conflict})

    def gradient_conflict(self, step: int, rows: pa.Table) -> dict[str, float]:
        """`grad_conflict/<a>__<b>` of the step's rows (TRAIN_COLUMNS) every
        eval.grad_conflict_every_steps steps (rl/grad_conflict.py), else nothing."""
        every = self.config.eval.grad_conflict_every_steps
        if not every or step % every:
            return {}
        domains = rows.column("domain")
        return gradient_conflict(self.trainer.policy_gradient, {
            name: train_samples_from_table(rows.filter(pc.equal(domains, name)))
            for name in dict.fromkeys(domains.to_pylist())})

    def save(self, step: int, config_hash: str) -> None:
        """Write checkpoint `step` from the live state in the background (the previous write
        is waited for first; checkpoint 0 and the last step's are waited for too)."""
        meta = CheckpointMeta(step=step, policy_version=self.policy_version, config_hash=config_hash)
        wait = step == 0 or step >= self.config.train.steps
        self.checkpoints.save(self.trainer.model, self.tokenizer, self.trainer.state_dict(), meta, wait=wait)

    def restore(self, target_version: int | None, seed: int) -> RestoreResult:
        """Load the newest intact checkpoint at or before `target_version` (None: the last
        committed step), replay the committed steps after it up to there."""
        self.checkpoints.wait()
        removed = self.lake.checkpoints.remove_partial(self.run_id)  # what a kill during a write left
        if removed:
            log.info("run %s: partial checkpoint folders of steps %s deleted", self.run_id, removed)
        committed = self.lake.committed_steps(self.run_id)
        last = max(committed, default=0) if target_version is None else target_version
        step = self.lake.latest_checkpoint(self.run_id, at_or_before=last)
        if step is None:
            return RestoreResult(-1, self.policy_version, None, {}, ())
        self.poisoned = True
        self.weights_generation += 1
        step, meta, trainer_state, fallbacks = self._load_newest_intact(step)
        self.trainer.load_state_dict(trainer_state)
        self.policy_version = meta.policy_version
        if self.trainer.reference_model is not None:  # the KL anchor: the warm-started policy
            with tempfile.TemporaryDirectory() as folder:
                self.lake.load_checkpoint(self.run_id, 0, Path(folder))
                load_policy_weights(Path(folder), self.trainer.reference_model)
        replayed: dict[int, dict[str, float]] = {}
        for replay in range(step + 1, last + 1):
            manifest = self.lake.read_manifest(self.run_id, replay)
            if manifest is None:
                raise VersionMismatch(f"step {replay} of run {self.run_id} is not committed; nothing to replay")
            result = self.update(replay, manifest.parts, derive_seed(seed, replay, "mini-batches"))
            replayed[replay] = result.metrics
            self.poisoned = True
        self.poisoned = False
        return RestoreResult(last, self.policy_version, step, replayed, tuple(fallbacks))

    def _load_newest_intact(self, step: int) -> tuple[int, CheckpointMeta, dict, list[str]]:
        """Checkpoint `step` into the policy, or, if it is corrupted (a file altered, missing,
        or a trainer pickle that would run code), the newest intact one before it.
        LakeCorrupted when none is intact."""
        fallbacks: list[str] = []
        while True:
            try:
                with tempfile.TemporaryDirectory() as folder:
                    self.lake.load_checkpoint(self.run_id, step, Path(folder))
                    source = f"{self.lake.uri.rstrip('/')}/checkpoints/{self.run_id}/step={step:06d}"
                    meta, trainer_state = load_checkpoint(Path(folder), self.trainer.model, source)
                return step, meta, trainer_state, fallbacks
            except LakeCorrupted as exc:
                older = self.lake.latest_checkpoint(self.run_id, at_or_before=step - 1) if step > 0 else None
                if older is None:
                    raise
                fallbacks.append(f"checkpoint {step} of run {self.run_id} is corrupted ({exc.message}); "
                                 f"falling back to checkpoint {older}")
                step = older


class _WarmStart:
    """rl/warmstart.py's loop in a thread; its accuracy checks wait for the controller."""

    def __init__(self, service: TrainerService, request: WarmStartBegin) -> None:
        self._events: queue.Queue = queue.Queue()
        self._decisions: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, args=(service, request), name="warm-start", daemon=True)
        self._thread.start()

    def _run(self, service: TrainerService, request: WarmStartBegin) -> None:
        try:
            optimizer, weights = service.trainer.warm_start_optimizer() if request.keep_optimizer else (None, None)
            warm_start(
                service.trainer.model, service.tokenizer, list(request.examples), steps=request.steps,
                batch_size=request.batch_size, lr=request.lr, seed=request.seed,
                stop_check=self._check if request.with_checks else None, check_every=request.check_every,
                on_step=lambda step, loss: self._stepped(service, step, loss), optimizer=optimizer, weights=weights,
            )
            if request.keep_optimizer:
                service.trainer.drop_momentum()
            self._events.put(("done",))
        except BaseException as exc:  # noqa: BLE001 - handed to the controller by wait()
            self._events.put(("error", exc, traceback.format_exc()))

    def _stepped(self, service: TrainerService, step: int, loss: float) -> None:
        service.weights_generation += 1  # a weight stream begun before this step is void
        self._events.put(("loss", step, loss))

    def _check(self, steps_done: int) -> bool:
        self._events.put(("check", steps_done))
        return self._decisions.get()

    def decide(self, stop: bool) -> None:
        self._decisions.put(stop)

    def wait(self, timeout_s: float) -> WarmStartState:
        losses: list[tuple[int, float]] = []
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                event = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
                if event[0] == "loss":
                    losses.append((event[1], event[2]))
                elif event[0] == "check":
                    return WarmStartState("check", tuple(losses), event[1])
                elif event[0] == "done":
                    return WarmStartState("done", tuple(losses))
                else:
                    log.error("warm-start failed:\n%s", event[2])
                    raise event[1]
        except queue.Empty:
            return WarmStartState("running", tuple(losses))
