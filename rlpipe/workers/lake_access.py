"""The run's lake from its config, for the controller and the trainer worker alike (light:
no torch). `create=False` opens an existing lake and creates nothing."""

from __future__ import annotations

from rlpipe.core.config import RunConfig
from rlpipe.storage.filesystem import open_lake_location
from rlpipe.storage.lake import Lake


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
