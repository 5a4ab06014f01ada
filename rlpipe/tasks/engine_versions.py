"""Which weights the engine worker holds, and how it gets the version a step needs.

Synchronous runs (rollout.max_staleness = 0) sync the trainer's weights straight into the
engine (publish + load, tasks/runtime.py `sync_weights`). In async runs the trainer moves
on while the engine still generates with an older version, so the controller publishes the
trainer's weights as a file on /dev/shm at the moment they are the version a later step
needs (`publish_current`), and the rollout lane loads that file before generating the step
(`ensure_engine_version`). A file is deleted once the engine has loaded a newer one; a
fresh engine worker (restarted after a crash) loads the version the lane last asked for.

Not here: when any of this runs (flows/), the file format (workers/weights.py).
"""

from __future__ import annotations

import threading
from pathlib import Path

from rlpipe.tasks.runtime import Runtime, sync_weights

_LOCK = threading.Lock()


def publish_current(runtime: Runtime) -> None:
    """Publish the trainer's current weights for a later load (no-op if published already)."""
    with _LOCK:
        if runtime.policy_version in runtime.published:
            return
    published = runtime.trainer.publish_weights()
    with _LOCK:
        runtime.published[published.policy_version] = published.path


def ensure_engine_version(runtime: Runtime, version: int) -> None:
    """Make the engine hold policy `version`: a published file of it, else (synchronous
    runs, or the trainer at that version) a direct sync."""
    runtime.engine_wanted = version
    if runtime.engine_version == version:
        return
    with _LOCK:
        path = runtime.published.get(version)
    if path is not None:
        runtime.engine_version = runtime.engine.load_weights_file(path, version)
        _discard_older(runtime, version)
    elif runtime.config.rollout.max_staleness == 0 or runtime.policy_version == version:
        sync_weights(runtime)
    else:
        raise RuntimeError(f"the engine needs policy version {version}, which is neither published nor the trainer's "
                           f"({runtime.policy_version}); the async schedule publishes it before the step is started")
    if runtime.engine_version != version:
        raise RuntimeError(f"the engine holds policy version {runtime.engine_version}, the step needs {version}")


def restore_engine_version(runtime: Runtime) -> None:
    """A fresh engine worker: load the version the lane last asked for if it is published,
    else the trainer's (tasks/runtime.py calls this from the engine client's restart hook)."""
    with _LOCK:
        path = runtime.published.get(runtime.engine_wanted) if runtime.engine_wanted is not None else None
    if path is not None:
        runtime.engine_version = runtime.engine.load_weights_file(path, runtime.engine_wanted)
    else:
        sync_weights(runtime)


def _discard_older(runtime: Runtime, version: int) -> None:
    with _LOCK:
        older = [v for v in runtime.published if v < version]
        paths = [runtime.published.pop(v) for v in older]
    for path in paths:
        Path(path).unlink(missing_ok=True)
