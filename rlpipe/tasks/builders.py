"""Light builders of the storage-side objects (lake, tracker) from RunConfig sections.

Kept apart from runtime.py (which imports torch and transformers) so that read-only
commands (`rlpipe runs`, `rlpipe query`) start fast. Like every builder, these turn a
config section into flat constructor arguments; library code never sees RunConfig.

`build_lake(config, create=False)` opens an existing lake and creates nothing (read-only
commands, run lookups): a missing folder or bucket is LakeNotFoundError. Only a training
run opens with `create=True`.
"""

from __future__ import annotations

from rlpipe.core.config import RunConfig
from rlpipe.storage.filesystem import open_lake_location
from rlpipe.storage.lake import Lake
from rlpipe.storage.tracking import Tracker, default_artifact_location, resolve_tracking_uri


def build_lake(config: RunConfig, create: bool = True) -> Lake:
    """The run's lake; its folder or bucket is made when missing only if `create`."""
    storage = config.storage
    return Lake(open_lake_location(
        storage.lake_uri,
        endpoint_url=storage.s3_endpoint_url,
        access_key=storage.s3_access_key,
        secret_key=storage.s3_secret_key,
        region=storage.s3_region,
        create=create,
    ))


def build_tracker(config: RunConfig) -> Tracker:
    uri = resolve_tracking_uri(config.tracking.mlflow_uri)
    return Tracker(uri, config.tracking.experiment, artifact_location=default_artifact_location(uri))
