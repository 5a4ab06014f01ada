"""Which weights the engine worker holds, and how it gets the version a step needs.

Synchronous runs (rollout.max_staleness = 0) sync the trainer's weights straight into the
engine (`sync_weights`). In async runs the trainer moves
on while the engine still generates with an older version, so the controller publishes the
trainer's weights as a file on /dev/shm at the moment they are the version a later step
needs (`publish_current`), and the rollout lane loads that file before generating the step
(`ensure_engine_version`). A file is deleted once the engine has loaded a newer one; a
fresh engine worker (restarted after a crash) loads the version the lane last asked for.

Not here: when any of this runs (flows/), the file format (workers/weights.py).
"""

from __future__ import annotations

import time
from pathlib import Path

from rlpipe.controller.runtime import Runtime
from rlpipe.workers.weight_stream import stream_weights

def sync_weights(runtime: Runtime) -> float:
    """Bring the trainer's weights into the engine; returns the seconds it took. The engine's
    acknowledged version is recorded. hf: streamed in bounded chunks copied in place
    (workers/weight_stream.py); other engines: one whole file published, loaded, deleted."""
    progress, workers = runtime.progress, runtime.workers
    started = time.perf_counter()
    if runtime.config.rollout.engine == "hf":
        progress.engine_version = stream_weights(workers.trainer, workers.engine).policy_version
        return time.perf_counter() - started
    published = workers.trainer.publish_weights()
    try:
        progress.engine_version = workers.engine.load_weights_file(published.path, published.policy_version)
    finally:
        Path(published.path).unlink(missing_ok=True)
    return time.perf_counter() - started


def sync_if_behind(runtime: Runtime) -> dict[str, float]:
    """Load the trainer's weights into the engine (unless it serves them already); returns
    `sync/seconds` (publish + load, 0 when nothing was to do) and the engine's version."""
    progress = runtime.progress
    seconds = 0.0
    if progress.engine_version != progress.policy_version:
        seconds = sync_weights(runtime)
    return {"sync/seconds": seconds, "sync/policy_version": float(progress.engine_version)}


def publish_current(runtime: Runtime) -> None:
    """Publish the trainer's current weights for a later load (no-op if published already)."""
    progress = runtime.progress
    with progress.published_lock:
        if progress.policy_version in progress.published:
            return
    published = runtime.workers.trainer.publish_weights()
    with progress.published_lock:
        progress.published[published.policy_version] = published.path


def ensure_engine_version(runtime: Runtime, version: int) -> None:
    """Make the engine hold policy `version`: a published file of it, else (synchronous
    runs, or the trainer at that version) a direct sync."""
    progress = runtime.progress
    progress.engine_wanted = version
    if progress.engine_version == version:
        return
    with progress.published_lock:
        path = progress.published.get(version)
    if path is not None:
        progress.engine_version = runtime.workers.engine.load_weights_file(path, version)
        _discard_older(runtime, version)
    elif runtime.config.rollout.max_staleness == 0 or progress.policy_version == version:
        sync_weights(runtime)
    else:
        raise RuntimeError(f"the engine needs policy version {version}, which is neither published nor the trainer's "
                           f"({progress.policy_version}); the async schedule publishes it before the step is started")
    if progress.engine_version != version:
        raise RuntimeError(f"the engine holds policy version {progress.engine_version}, the step needs {version}")


def restore_engine_version(runtime: Runtime) -> None:
    """A fresh engine worker: load the version the lane last asked for if it is published,
    else the trainer's (controller/launch.py makes this the engine client's restart hook)."""
    progress = runtime.progress
    with progress.published_lock:
        path = progress.published.get(progress.engine_wanted) if progress.engine_wanted is not None else None
    if path is not None:
        progress.engine_version = runtime.workers.engine.load_weights_file(path, progress.engine_wanted)
    else:
        sync_weights(runtime)


def _discard_older(runtime: Runtime, version: int) -> None:
    progress = runtime.progress
    with progress.published_lock:
        older = [v for v in progress.published if v < version]
        paths = [progress.published.pop(v) for v in older]
    for path in paths:
        Path(path).unlink(missing_ok=True)
