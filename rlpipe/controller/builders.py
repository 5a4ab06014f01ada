"""Light builders of the storage-side objects (lake, tracker) from RunConfig sections.

Kept apart from runtime.py (which spawns workers) so that read-only
commands (`rlpipe runs`, `rlpipe query`) start fast. Like every builder, these turn a
config section into flat constructor arguments; library code never sees RunConfig.

`build_lake(config, create=False)` opens an existing lake and creates nothing (read-only
commands, run lookups): a missing folder or bucket is LakeNotFoundError. Only a training
run opens with `create=True`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlpipe.core.config import RunConfig
from rlpipe.workers.lake_access import build_lake

if TYPE_CHECKING:
    from rlpipe.storage.tracking import Tracker

__all__ = ["build_lake", "build_tracker"]


def build_tracker(config: RunConfig) -> Tracker:
    from rlpipe.storage.tracking import Tracker, default_artifact_location, resolve_tracking_uri  # mlflow: ~2 s

    uri = resolve_tracking_uri(config.tracking.mlflow_uri)
    return Tracker(uri, config.tracking.experiment, artifact_location=default_artifact_location(uri))
