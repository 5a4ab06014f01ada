"""Lake behaviours checked on every backend: test_lake_local.py and test_lake_s3.py call
each function with a fresh, empty Lake."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from rlpipe.core.errors import LakeCorrupted, RunNotFoundError, StorageUnavailable, UserError
from rlpipe.storage.lake import Lake, set_apart_path
from rlpipe.storage.lake_records import CheckpointFile, CheckpointInfo, RunInfo, RunState, RunStatus, StepManifest
from rlpipe.storage.query import query_trajectories
from tests.helpers.trajectories import make_trajectories


def _commit(lake: Lake, run_id: str, step: int, counts: tuple[int, ...]) -> StepManifest:
    parts = tuple(
        lake.write_part(run_id, step, f"rollout-{i}", make_trajectories(run_id, step, count))
        for i, count in enumerate(counts)
    )
    manifest = StepManifest(
        run_id=run_id, step=step, policy_version=step, parts=parts, rows=sum(counts),
        metrics=(("reward/mean", 0.5), ("train/loss", 1.5)), committed_at_ms=1_700_000_000_000 + step,
    )
    return lake.commit_step(manifest)


def run_info_and_status(lake: Lake) -> None:
    assert lake.read_run_info("r1") is None
    assert lake.read_status("r1") is None
    info = RunInfo(run_id="r1", config_json='{"a": 1}', config_hash="h", code_version="abc",
                   created_at_ms=123, mlflow_run_id=None, prefect_flow_run_id="p-1")
    lake.write_run_info(info)
    lake.write_run_info(RunInfo(run_id="r0", config_json="{}", config_hash="h0", code_version="x", created_at_ms=1))
    assert lake.read_run_info("r1") == info
    assert lake.list_runs() == ["r0", "r1"]
    status = RunStatus(run_id="r1", state=RunState.RUNNING, step=3, stage="verify", error=None, updated_at_ms=9)
    lake.write_status(status)
    assert lake.read_status("r1") == status
    failed = RunStatus(run_id="r1", state=RunState.FAILED, step=3, stage="train", error="boom", updated_at_ms=10)
    lake.write_status(failed)
    assert lake.read_status("r1") == failed


def parts_round_trip_exactly(lake: Lake) -> None:
    trajectories = make_trajectories("r1", 2, 10)
    ref = lake.write_part("r1", 2, "a", trajectories)
    assert ref.rows == 10
    assert ref.path == "trajectories/run_id=r1/step=2/part-a.parquet"
    assert lake.read_parts([ref]) == trajectories
    again = lake.write_part("r1", 2, "a", trajectories)  # a retried write: same key, same bytes
    assert again == ref


def committed_steps_need_a_manifest(lake: Lake) -> None:
    _commit(lake, "r1", 0, (3, 2))
    _commit(lake, "r1", 1, (4,))
    lake.write_part("r1", 2, "rollout-0", make_trajectories("r1", 2, 4))  # crash before commit
    assert lake.committed_steps("r1") == [0, 1]
    assert lake.read_manifest("r1", 2) is None
    manifest = lake.read_manifest("r1", 0)
    assert manifest is not None and manifest.rows == 5 and len(manifest.parts) == 2
    assert manifest.metric("reward/mean") == 0.5
    assert len(lake.read_parts(manifest.parts)) == 5


def recommit_keeps_the_first_manifest(lake: Lake) -> None:
    first = _commit(lake, "r1", 0, (3,))
    retry = StepManifest(run_id="r1", step=0, policy_version=0, parts=first.parts, rows=3,
                         metrics=(("reward/mean", 0.9),), committed_at_ms=first.committed_at_ms + 999)
    assert lake.commit_step(retry) == first
    assert lake.read_manifest("r1", 0) == first


def commit_rejects_missing_parts(lake: Lake) -> None:
    ref = lake.write_part("r1", 0, "a", make_trajectories("r1", 0, 2))
    bad = StepManifest(run_id="r1", step=0, policy_version=0, parts=(ref,), rows=3, metrics=(), committed_at_ms=1)
    with pytest.raises(ValueError):
        lake.commit_step(bad)
    assert lake.committed_steps("r1") == []


def query_counts_only_committed_parts(lake: Lake) -> None:
    lake.write_run_info(RunInfo(run_id="r1", config_json="{}", config_hash="h", code_version="x", created_at_ms=1))
    _commit(lake, "r1", 0, (3, 2))
    _commit(lake, "r1", 1, (4,))
    lake.write_part("r1", 2, "rollout-0", make_trajectories("r1", 2, 7))  # orphan
    result = query_trajectories(lake, "select step, count(*) as n from trajectories group by step order by step")
    assert result.columns == ("step", "n")
    assert result.rows == [(0, 5), (1, 4)]
    # rewards: index 0..2 -> 1,0,1; 0..1 -> 1,0; 0..3 -> 1,0,1,0 ; none unscored below index 4
    assert query_trajectories(lake, "select sum(reward) from trajectories").rows == [(5.0,)]
    metrics = query_trajectories(lake, "select step, reward_mean, loss from step_metrics order by step")
    assert metrics.rows == [(0, 0.5, 1.5), (1, 0.5, 1.5)]
    values = query_trajectories(lake, "select step, value from step_metric_values where name = 'train/loss' order by step")
    assert values.rows == [(0, 1.5), (1, 1.5)]
    one_run = query_trajectories(lake, "select count(*) from trajectories", run_id="r1")
    assert one_run.rows == [(9,)]
    with pytest.raises(RunNotFoundError):
        query_trajectories(lake, "select 1", run_id="no-such-run")
    with pytest.raises(UserError):
        query_trajectories(lake, "selec nonsense")
    with pytest.raises(UserError):
        query_trajectories(lake, "select no_such_column from trajectories")


def query_on_empty_lake(lake: Lake) -> None:
    assert query_trajectories(lake, "select count(*) from trajectories").rows == [(0,)]


def checkpoints_and_latest(lake: Lake, tmp_path: Path) -> None:
    assert lake.latest_checkpoint("r1") is None
    for step in (10, 20):
        source = tmp_path / f"ckpt-{step}"
        (source / "trainer").mkdir(parents=True)
        (source / "model.safetensors").write_bytes(bytes(range(256)) * (step + 1))
        (source / "trainer" / "state.json").write_text(f'{{"step": {step}}}')
        info = lake.save_checkpoint("r1", step, source)
        assert [f.path for f in info.files] == ["model.safetensors", "trainer/state.json"]
        assert info.write_s is not None and info.write_s >= 0 and info.write_cpu_s is not None and info.write_cpu_s >= 0
    assert lake.latest_checkpoint("r1") == 20
    assert lake.latest_checkpoint("r1", at_or_before=19) == 10
    assert lake.latest_checkpoint("r1", at_or_before=20) == 20
    assert lake.latest_checkpoint("r1", at_or_before=9) is None
    target = tmp_path / "restored"
    info = lake.load_checkpoint("r1", 10, target)
    assert info is not None and info.step == 10
    assert (target / "model.safetensors").read_bytes() == bytes(range(256)) * 11
    assert (target / "trainer" / "state.json").read_text() == '{"step": 10}'
    assert lake.load_checkpoint("r1", 15, tmp_path / "nothing") is None
    # a retried save of step 10 keeps the complete one, and LATEST never moves back
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.bin").write_bytes(b"different")
    assert lake.save_checkpoint("r1", 10, tmp_path / "other") == info
    assert lake.latest_checkpoint("r1") == 20
    # an altered checkpoint file is LakeCorrupted (not retried), named with the file: one
    # byte changed, the size kept, is caught by the digest new checkpoints record (xxh3_128)
    assert {file.digest[0] for file in info.files} == {"xxh3_128"}
    weights = lake.objects.get("checkpoints/r1/step=000020/model.safetensors")
    lake.objects.put("checkpoints/r1/step=000020/model.safetensors", weights[:100] + bytes([weights[100] ^ 1]) + weights[101:])
    with pytest.raises(LakeCorrupted, match="model.safetensors has xxh3_128 [0-9a-f]{32}, expected"):
        lake.load_checkpoint("r1", 20, tmp_path / "corrupt")
    # a listed file that is gone is LakeCorrupted too (lost, not unreachable: never retried)
    lake.location.filesystem.delete_file(lake.location.path("checkpoints/r1/step=000010/trainer/state.json"))
    with pytest.raises(LakeCorrupted, match="step=000010 lacks trainer/state.json"):
        lake.load_checkpoint("r1", 10, tmp_path / "lost")


def checkpoint_without_marker_is_ignored(lake: Lake, tmp_path: Path) -> None:
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "w.bin").write_bytes(b"x")
    lake.save_checkpoint("r1", 5, source)
    # a crash mid-upload of step 8: files but no CHECKPOINT.json and no new LATEST
    lake.objects.put("checkpoints/r1/step=000008/w.bin", b"partial")
    assert lake.latest_checkpoint("r1") == 5
    lake.objects.put("checkpoints/r1/LATEST", b"8")  # even a LATEST that points at it is not trusted
    assert lake.latest_checkpoint("r1") == 5
    assert lake.latest_checkpoint("r1", at_or_before=100) == 5


def checkpoint_recorded_with_sha256_is_read_and_checked_with_it(lake: Lake, tmp_path: Path) -> None:
    """A checkpoint written before xxh3_128 (its CHECKPOINT.json records sha256) loads, and
    an altered file of it is still caught."""
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "w.bin").write_bytes(bytes(range(256)) * 9)
    info = lake.save_checkpoint("old", 4, source)
    older = CheckpointInfo(info.run_id, info.step, (CheckpointFile("w.bin", 256 * 9, sha256=hashlib.sha256((source / "w.bin").read_bytes()).hexdigest()),),
                           info.saved_at_ms)
    lake.objects.put("checkpoints/old/step=000004/CHECKPOINT.json", older.to_json().encode())
    assert lake.load_checkpoint("old", 4, tmp_path / "loaded") == older
    assert (tmp_path / "loaded" / "w.bin").read_bytes() == (source / "w.bin").read_bytes()
    lake.objects.put("checkpoints/old/step=000004/w.bin", bytes([1]) + (source / "w.bin").read_bytes()[1:])
    with pytest.raises(LakeCorrupted, match="w.bin has sha256 [0-9a-f]{64}, expected " + older.files[0].sha256):
        lake.load_checkpoint("old", 4, tmp_path / "altered")


def altered_part_is_detected(lake: Lake) -> None:
    manifest = _commit(lake, "r1", 0, (3,))
    lake.objects.put(manifest.parts[0].path, b"not parquet")
    with pytest.raises(LakeCorrupted):  # not retried: the same bytes would be read again
        lake.read_parts(manifest.parts)
    lake.location.filesystem.delete_file(lake.location.path(manifest.parts[0].path))
    with pytest.raises(LakeCorrupted):
        lake.read_parts(manifest.parts)


def staged_rows_and_documents(lake: Lake) -> None:
    rows = make_trajectories("r1", 3, 6)
    staged = lake.write_staged("r1", 3, "generate", "key-a", rows)
    assert staged.startswith("staging/run_id=r1/step=3/generate-")
    assert lake.read_staged("r1", 3, "generate", "key-a") == rows
    assert lake.read_staged("r1", 3, "generate", "key-b") is None  # another key: another incarnation, config or policy
    assert lake.read_staged("r1", 3, "verify", "key-a") is None
    assert lake.write_staged("r1", 3, "generate", "key-b", rows[:2]) != staged
    assert lake.read_staged("r1", 3, "generate", "key-a") == rows  # untouched by the other key's rows
    with pytest.raises(UserError):
        lake.write_staged("r1", 3, "../generate", "key-a", rows)
    assert query_trajectories(lake, "select count(*) from trajectories").rows == [(0,)]
    lake.clean_staged("r1", 3)
    assert lake.read_staged("r1", 3, "generate", "key-a") is None  # gone: the caller computes them again
    lake.clean_staged("r1", 3)  # again: nothing to do
    assert lake.read_json("r1", "evals/before_rl.json") is None
    lake.write_json("r1", "evals/before_rl.json", {"accuracy": 0.25, "policy_version": 0})
    assert lake.read_json("r1", "evals/before_rl.json") == {"accuracy": 0.25, "policy_version": 0}
    with pytest.raises(ValueError):
        lake.write_json("r1", "../x.json", {})
    with pytest.raises(ValueError):
        lake.write_json("r1", "run.json", {})


def query_with_a_lost_part_is_storage_unavailable(lake: Lake) -> None:
    manifest = _commit(lake, "r1", 0, (3,))
    lake.location.filesystem.delete_file(lake.location.path(manifest.parts[0].path))
    with pytest.raises(StorageUnavailable):
        query_trajectories(lake, "select count(*) from trajectories")


def staged_rows_are_digest_checked(lake: Lake) -> None:
    rows = make_trajectories("r1", 4, 5)
    staged = lake.write_staged("r1", 4, "verify", "key-a", rows)
    assert lake.read_staged("r1", 4, "verify", "key-a") == rows
    other = lake.write_staged("r1", 4, "verify", "key-b", rows[:2])
    lake.objects.put(staged, lake.objects.get(other))  # valid rows of another key: only the digest tells
    assert lake.read_staged("r1", 4, "verify", "key-a") is None  # not used: the stage computes them again
    lake.objects.put(staged, b"ARROW1 torn")
    assert lake.read_staged("r1", 4, "verify", "key-a") is None
    lake.write_staged("r1", 4, "verify", "key-a", rows)  # computed again and staged again
    assert lake.read_staged("r1", 4, "verify", "key-a") == rows
    # rows whose PartRef was never written (a crash between the two writes) are not used
    lake.location.filesystem.delete_file(lake.location.path(other.removesuffix(".arrow") + ".json"))
    assert lake.objects.get(other) is not None and lake.read_staged("r1", 4, "verify", "key-b") is None


def parts_read_in_bounded_batches(lake: Lake) -> None:
    manifest = _commit(lake, "r1", 0, (7, 3))
    batches = list(lake.iter_parts(manifest.parts, batch_rows=3))
    assert [len(batch) for batch in batches] == [3, 3, 1, 3]  # never more than 3, never across parts
    assert [row for batch in batches for row in batch] == lake.read_parts(manifest.parts)
    lake.objects.put(manifest.parts[1].path, lake.objects.get(manifest.parts[0].path))
    with pytest.raises(LakeCorrupted, match="sha256"):
        list(lake.iter_parts(manifest.parts, batch_rows=3))


def set_apart_rows_live_outside_trajectories(lake: Lake) -> None:
    trained, apart = make_trajectories("r1", 2, 4), make_trajectories("r1", 2, 6)
    part = lake.write_part("r1", 2, "00000", trained)
    set_apart = lake.write_set_apart("r1", 2, apart)
    assert set_apart.path == "set_apart/run_id=r1/step=2/part-set-apart.parquet"
    lake.commit_step(StepManifest(run_id="r1", step=2, policy_version=2, parts=(part,), rows=4, metrics=(),
                                  committed_at_ms=1, set_apart=(set_apart,)))
    assert not [info for info in lake.objects.list("trajectories", recursive=True) if "set-apart" in info.path]
    assert lake.read_parts((set_apart,)) == apart
    counts = "select (select count(*) from trajectories), (select count(*) from set_apart)"
    assert query_trajectories(lake, counts).rows == [(4, 6)]
    assert query_trajectories(lake, "select distinct run_id, step from set_apart").rows == [("r1", 2)]


def set_apart_parts_of_the_older_layout_read_where_they_are_or_once_moved(lake: Lake) -> None:
    trained, apart = make_trajectories("old", 1, 3), make_trajectories("old", 1, 5)
    part = lake.write_part("old", 1, "00000", trained)
    legacy = lake.write_part("old", 1, "set-apart", apart)  # where the older layout wrote them
    assert legacy.path == "trajectories/run_id=old/step=1/part-set-apart.parquet"
    lake.commit_step(StepManifest(run_id="old", step=1, policy_version=1, parts=(part,), rows=3, metrics=(),
                                  committed_at_ms=1, set_apart=(legacy,)))
    counts = "select (select count(*) from trajectories), (select count(*) from set_apart), " \
             "(select count(distinct step) from set_apart where run_id = 'old')"
    assert query_trajectories(lake, counts).rows == [(3, 5, 1)]
    assert lake.read_parts((legacy,)) == apart
    moved = set_apart_path(legacy.path)
    assert moved == "set_apart/run_id=old/step=1/part-set-apart.parquet"
    lake.objects.put(moved, lake.objects.get(legacy.path))
    lake.location.filesystem.delete_file(lake.location.path(legacy.path))
    assert query_trajectories(lake, counts).rows == [(3, 5, 1)]  # the manifest is unchanged
    assert [row for batch in lake.iter_parts((legacy,), batch_rows=2) for row in batch] == apart
    lake.objects.put(moved, lake.objects.get(part.path))  # moved, then altered: still checked
    with pytest.raises(LakeCorrupted, match="sha256"):
        lake.read_parts((legacy,))


ALL_BEHAVIOURS = (
    query_with_a_lost_part_is_storage_unavailable,
    staged_rows_and_documents,
    run_info_and_status,
    parts_round_trip_exactly,
    committed_steps_need_a_manifest,
    recommit_keeps_the_first_manifest,
    commit_rejects_missing_parts,
    query_counts_only_committed_parts,
    query_on_empty_lake,
    altered_part_is_detected,
    staged_rows_are_digest_checked,
    parts_read_in_bounded_batches,
    set_apart_rows_live_outside_trajectories,
    set_apart_parts_of_the_older_layout_read_where_they_are_or_once_moved,
)
"""Behaviours that take only a lake (checkpoint ones also take tmp_path)."""

