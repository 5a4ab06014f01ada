"""The lake on S3 (a moto server in its own process, over real HTTP on 127.0.0.1)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rlpipe.core.errors import ConfigError, StorageUnavailable
from rlpipe.storage.lake import Lake
from tests.helpers.s3_server import free_port, start_moto_server
from tests.storage import lake_behaviours
from tests.storage.conftest import S3_KEYS
from tests.storage.lake_behaviours import ALL_BEHAVIOURS


@pytest.mark.parametrize("behaviour", ALL_BEHAVIOURS, ids=lambda b: b.__name__)
def test_behaviour(s3_lake: Lake, behaviour: Callable[[Lake], None]) -> None:
    behaviour(s3_lake)


def test_checkpoints_and_latest(s3_lake: Lake, tmp_path: Path) -> None:
    lake_behaviours.checkpoints_and_latest(s3_lake, tmp_path)


def test_checkpoint_without_marker_is_ignored(s3_lake: Lake, tmp_path: Path) -> None:
    lake_behaviours.checkpoint_without_marker_is_ignored(s3_lake, tmp_path)


def test_reopening_an_existing_bucket_sees_the_same_lake(s3_lake: Lake, s3_endpoint: str) -> None:
    lake_behaviours.run_info_and_status(s3_lake)
    again = Lake.open(s3_lake.uri, endpoint_url=s3_endpoint, **S3_KEYS)
    assert again.list_runs() == ["r0", "r1"]


def test_settings_come_from_the_environment(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    lake = Lake.open("s3://env-lake")
    assert lake.location.s3 is not None and lake.location.s3.endpoint_url == s3_endpoint
    lake_behaviours.parts_round_trip_exactly(lake)


def test_unreachable_endpoint_fails_fast() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(StorageUnavailable) as caught:
        Lake.open("s3://lake/prefix", endpoint_url=endpoint, **S3_KEYS)
    assert time.monotonic() - started < 5.0
    assert endpoint in str(caught.value) and caught.value.hint


def test_endpoint_that_goes_away_gives_storage_unavailable(tmp_path: Path) -> None:
    endpoint, stop = start_moto_server()
    try:
        lake = Lake.open("s3://going-away/p", endpoint_url=endpoint, **S3_KEYS)
        lake_behaviours.committed_steps_need_a_manifest(lake)
    finally:
        stop()
    started = time.monotonic()
    with pytest.raises(StorageUnavailable):
        lake.committed_steps("r1")
    with pytest.raises(StorageUnavailable):
        lake.write_part("r1", 5, "x", [])
    assert time.monotonic() - started < 20.0


def test_bad_endpoint_or_bucket_is_config_error(s3_endpoint: str) -> None:
    with pytest.raises(ConfigError):
        Lake.open("s3://lake", endpoint_url="127.0.0.1:9000", **S3_KEYS)  # no scheme
    with pytest.raises(ConfigError):
        Lake.open("s3://Bad_Bucket/x", endpoint_url=s3_endpoint, **S3_KEYS)
