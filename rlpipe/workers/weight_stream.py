"""The synchronous weight sync in bounded chunks: the controller's side (torch-free).

    trainer: BeginWeightStream -> plan (stream id, version, chunk count, rows of each weight)
    engine:  BeginWeightLoad(plan)
    for each chunk: trainer writes it to /dev/shm (PublishWeightChunk); engine copies it in
                    place into its parameters and deletes it (LoadWeightChunk)
    engine:  EndWeightLoad -> checks every row of every weight arrived, serves the version

Only one chunk (CHUNK_BYTES, 64 MiB) is on /dev/shm at a time, so a sync adds about one chunk
to the run's memory instead of a whole copy of the weights beside the engine's (the whole-file
sync, workers/weights.publish, which async runs keep: their file must outlive the trainer's
next update, controller/weight_sync.py).

Atomic from the run's point of view: the engine serves the new version only after
EndWeightLoad; from its first chunk until then it refuses to generate and exits on any
failure (engine_worker.py). If anything fails mid-stream (the trainer dies or its weights
change, a chunk file vanishes, the engine dies), the engine worker is stopped here and the
error raised (EngineFailed: an infra error, so the task is retried); the next call to the
engine starts a fresh worker, whose restart hook syncs it fully (controller/launch.py, controller/weight_sync.py).

Not here: when to sync (tasks/), chunk files (workers/weights.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlpipe.workers import protocol as p
from rlpipe.workers.client import EngineClient, TrainerClient

CHUNK_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class StreamedWeights:
    policy_version: int  # what the engine acknowledged
    bytes: int
    chunks: int


def stream_weights(trainer: TrainerClient, engine: EngineClient, chunk_bytes: int = CHUNK_BYTES) -> StreamedWeights:
    """Sync the trainer's current weights into the engine, one chunk at a time (see above)."""
    folder = Path(trainer.spec.weights_folder)
    plan: p.WeightStreamPlan = trainer.call(p.BeginWeightStream(chunk_bytes))
    path = None
    try:
        engine.call(p.BeginWeightLoad(plan.stream_id, plan.policy_version, plan.rows))
        for index in range(plan.chunks):
            chunk: p.WeightChunk = trainer.call(p.PublishWeightChunk(plan.stream_id, index, str(folder)))
            path = Path(chunk.path)
            engine.call(p.LoadWeightChunk(plan.stream_id, chunk.path))  # the engine deletes the file
        version = engine.call(p.EndWeightLoad(plan.stream_id))
    except BaseException:
        if path is not None:
            path.unlink(missing_ok=True)
        engine.stop()  # maybe mixed weights: never serve them; the next call starts a fresh, fully synced worker
        raise
    return StreamedWeights(version, plan.bytes, plan.chunks)
