"""The lake on a local folder: the shared behaviours plus local-only properties."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from rlpipe.core.errors import ConfigError, StorageUnavailable
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import RunState, RunStatus
from tests.storage import lake_behaviours
from tests.storage.lake_behaviours import ALL_BEHAVIOURS


@pytest.mark.parametrize("behaviour", ALL_BEHAVIOURS, ids=lambda b: b.__name__)
def test_behaviour(local_lake: Lake, behaviour: Callable[[Lake], None]) -> None:
    behaviour(local_lake)


def test_checkpoints_and_latest(local_lake: Lake, tmp_path: Path) -> None:
    lake_behaviours.checkpoints_and_latest(local_lake, tmp_path)


def test_checkpoint_without_marker_is_ignored(local_lake: Lake, tmp_path: Path) -> None:
    lake_behaviours.checkpoint_without_marker_is_ignored(local_lake, tmp_path)


def test_checkpoint_recorded_with_sha256_is_read_and_checked_with_it(local_lake: Lake, tmp_path: Path) -> None:
    lake_behaviours.checkpoint_recorded_with_sha256_is_read_and_checked_with_it(local_lake, tmp_path)


def test_layout_on_disk(tmp_path: Path) -> None:
    lake = Lake.open(str(tmp_path / "lake"))
    lake_behaviours.committed_steps_need_a_manifest(lake)
    root = tmp_path / "lake"
    assert (root / "runs/r1/steps/000000/MANIFEST.json").is_file()
    assert (root / "trajectories/run_id=r1/step=0/part-rollout-0.parquet").is_file()
    assert not [p for p in root.rglob("*") if p.name.startswith(".tmp-")]  # no leftovers


def test_file_uri_opens_the_same_folder(tmp_path: Path) -> None:
    lake_behaviours.run_info_and_status(Lake.open(str(tmp_path / "lake")))
    assert Lake.open(f"file://{tmp_path / 'lake'}").list_runs() == ["r0", "r1"]


def test_bad_names_and_uris_are_config_errors(local_lake: Lake, tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        local_lake.read_run_info("../escape")
    with pytest.raises(ConfigError):
        Lake.open("gs://bucket/prefix")
    with pytest.raises(ConfigError):
        Lake.open("s3:///no-bucket")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
def test_unwritable_folder_is_storage_unavailable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(StorageUnavailable):
        Lake.open(str(locked / "lake"))


def test_altered_staged_rows_are_named_in_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from tests.helpers.trajectories import make_trajectories

    lake = Lake.open(str(tmp_path / "lake"))
    staged = lake.write_staged("r1", 1, "generate", "key", make_trajectories("r1", 1, 3))
    path = tmp_path / "lake" / staged
    path.write_bytes(path.read_bytes()[:-1] + b"\0")
    with caplog.at_level("WARNING", logger="rlpipe.storage.lake"):
        assert lake.read_staged("r1", 1, "generate", "key") is None
    [record] = [r for r in caplog.records if r.name == "rlpipe.storage.lake"]
    assert staged in record.getMessage() and "computes them again" in record.getMessage()


def test_a_damaged_staged_partref_means_compute_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Staged rows are not fsynced: after a power cut their PartRef may be empty or cut
    short. It is read as no staged rows (a warning), never as an error that fails the stage."""
    from tests.helpers.trajectories import make_trajectories

    lake = Lake.open(str(tmp_path / "lake"))
    staged = lake.write_staged("r1", 1, "verify", "key", make_trajectories("r1", 1, 3))
    ref = tmp_path / "lake" / staged.replace(".arrow", ".json")
    for damaged in (b"", ref.read_bytes()[:10]):
        ref.write_bytes(damaged)
        with caplog.at_level("WARNING", logger="rlpipe.storage.lake"):
            assert lake.read_staged("r1", 1, "verify", "key") is None
        assert "does not parse" in caplog.records[-1].getMessage()


def test_staged_rows_skip_fsync_committed_parts_do_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.trajectories import make_trajectories

    lake = Lake.open(str(tmp_path / "lake"))
    rows = make_trajectories("r1", 1, 3)
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    lake.write_staged("r1", 1, "generate", "key", rows)
    assert synced == []
    lake.write_part("r1", 1, "00000", rows)
    assert len(synced) == 2  # the file, then its folder (the rename)


def test_a_running_status_skips_fsync_an_ended_one_does_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """status.json is rewritten at every step: a running run's is not fsynced (the manifests
    are the truth), a failed or finished run's is. A status a power cut left empty or cut
    short reads as none, with a warning, never as an error (`rlpipe resume`, `runs show`)."""
    lake = Lake.open(str(tmp_path / "lake"))
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    lake.write_status(RunStatus("r1", RunState.RUNNING, 3, "rl-step", None, 9))
    assert synced == []
    for ended in (RunState.FAILED, RunState.FINISHED):
        lake.write_status(RunStatus("r1", ended, 3, "rl-step", None, 10))
        assert len(synced) == 2  # the file, then its folder (the rename)
        synced.clear()
    path = tmp_path / "lake" / "runs" / "r1" / "status.json"
    for damaged in (b"", path.read_bytes()[:12], b"\xff\xfe"):
        path.write_bytes(damaged)
        with caplog.at_level("WARNING", logger="rlpipe.storage.lake"):
            assert lake.read_status("r1") is None
        assert "status.json of run r1 does not parse" in caplog.records[-1].getMessage()
