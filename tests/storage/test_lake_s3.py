"""The lake on S3 (the session's moto server in its own process, over real HTTP on 127.0.0.1;
each test in buckets of its own)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rlpipe.core.errors import ConfigError, StorageUnavailable
from rlpipe.storage.lake import Lake
from tests.helpers.ports import free_port
from tests.helpers.s3_server import unique_bucket
from tests.helpers.tcp_proxy import TcpProxy
from tests.helpers.waiting import returns_within
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


def test_checkpoint_recorded_with_sha256_is_read_and_checked_with_it(s3_lake: Lake, tmp_path: Path) -> None:
    lake_behaviours.checkpoint_recorded_with_sha256_is_read_and_checked_with_it(s3_lake, tmp_path)


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
    lake = Lake.open(f"s3://{unique_bucket('env-lake')}")
    assert lake.location.s3 is not None and lake.location.s3.endpoint_url == s3_endpoint
    lake_behaviours.parts_round_trip_exactly(lake)


def test_unreachable_endpoint_is_storage_unavailable_with_a_hint() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(StorageUnavailable) as caught:
        returns_within(lambda: Lake.open("s3://lake/prefix", endpoint_url=endpoint, **S3_KEYS), "Lake.open")
    assert endpoint in str(caught.value) and caught.value.hint


def test_endpoint_that_goes_away_gives_storage_unavailable(s3_endpoint: str) -> None:
    """The lake reaches S3 through a proxy that then goes away (the session's server stays)."""
    host, port = s3_endpoint.removeprefix("http://").split(":")
    proxy = TcpProxy(host, int(port)).start()
    try:
        lake = Lake.open(f"s3://{unique_bucket('going-away')}/p", endpoint_url=proxy.endpoint_url, **S3_KEYS)
        lake_behaviours.committed_steps_need_a_manifest(lake)
    finally:
        proxy.stop()
    with pytest.raises(StorageUnavailable):
        returns_within(lambda: lake.committed_steps("r1"), "committed_steps")
    with pytest.raises(StorageUnavailable):
        returns_within(lambda: lake.write_part("r1", 5, "x", []), "write_part")


def test_bad_endpoint_or_bucket_is_config_error(s3_endpoint: str) -> None:
    with pytest.raises(ConfigError):
        Lake.open("s3://lake", endpoint_url="127.0.0.1:9000", **S3_KEYS)  # no scheme
    with pytest.raises(ConfigError):
        Lake.open("s3://Bad_Bucket/x", endpoint_url=s3_endpoint, **S3_KEYS)
