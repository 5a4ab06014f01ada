"""The lake's JSON documents: the typed serializer writes the text the lake has always held
and reads it back exactly, checking types."""

from __future__ import annotations

import math

import pytest

from rlpipe.storage.lake_records import CheckpointFile, CheckpointInfo, PartRef, RunInfo, RunState, RunStatus, StepManifest

MANIFEST = StepManifest(
    run_id="r1", step=2, policy_version=1, parts=(PartRef(path="trajectories/run_id=r1/step=2/part-00000.parquet",
                                                          rows=3, sha256="ab"),),
    rows=3, metrics=(("reward/mean", 0.5), ("verify/timeout_rate", 0.0)), committed_at_ms=9,
)

# the on-disk text of MANIFEST, as the hand-written codec wrote it (json.dumps, indent=2, field order)
MANIFEST_TEXT = """{
  "run_id": "r1",
  "step": 2,
  "policy_version": 1,
  "parts": [
    {
      "path": "trajectories/run_id=r1/step=2/part-00000.parquet",
      "rows": 3,
      "sha256": "ab"
    }
  ],
  "rows": 3,
  "metrics": [
    [
      "reward/mean",
      0.5
    ],
    [
      "verify/timeout_rate",
      0.0
    ]
  ],
  "committed_at_ms": 9,
  "set_apart": []
}"""


def test_a_manifest_is_written_as_before_and_read_back_equal():
    assert MANIFEST.to_json() == MANIFEST_TEXT
    assert StepManifest.from_json(MANIFEST_TEXT) == MANIFEST
    # a manifest written before `set_apart` existed reads with none
    older = MANIFEST_TEXT.replace(',\n  "set_apart": []', "")
    assert '"set_apart"' not in older and StepManifest.from_json(older) == MANIFEST


def test_status_writes_its_state_as_the_value_and_escapes_non_ascii():
    status = RunStatus(run_id="r1", state=RunState.FAILED, step=4, stage="verify", error="bad ü", updated_at_ms=7)
    text = status.to_json()
    assert '"state": "failed"' in text and '"error": "bad \\u00fc"' in text
    assert RunStatus.from_json(text) == status


def test_run_info_without_tracking_ids_reads_them_as_none_and_ignores_unknown_keys():
    text = '{"run_id": "r", "config_json": "{}", "config_hash": "h", "code_version": "v", "created_at_ms": 1, "later": 2}'
    assert RunInfo.from_json(text) == RunInfo("r", "{}", "h", "v", 1, None, None)


def test_a_nan_metric_round_trips():
    manifest = StepManifest("r", 1, 0, (), 0, (("train/kl", float("nan")),), 1)
    assert '"NaN"' not in manifest.to_json() and "NaN" in manifest.to_json()  # json.dumps' literal
    assert math.isnan(StepManifest.from_json(manifest.to_json()).metric("train/kl"))


def test_checkpoint_info_round_trips_with_its_files():
    info = CheckpointInfo("r", 3, (CheckpointFile.of("model.safetensors", 10, "xxh3_128", "x"), CheckpointFile("a/b.json", 2, sha256="y")), 5)
    assert CheckpointInfo.from_json(info.to_json()) == info
    assert [file.digest for file in info.files] == [("xxh3_128", "x"), ("sha256", "y")]
    timed = CheckpointInfo("r", 3, info.files, 5, write_s=1.5, write_cpu_s=0.25)
    assert CheckpointInfo.from_json(timed.to_json()) == timed


def test_a_checkpoint_file_of_an_older_manifest_reads_its_sha256():
    text = '{"run_id": "r", "step": 3, "saved_at_ms": 5, "files": [{"path": "m", "size_bytes": 1, "sha256": "ab"}]}'
    assert CheckpointInfo.from_json(text).files[0].digest == ("sha256", "ab")


@pytest.mark.parametrize("digests", ['', ', "sha256": "ab", "xxh3_128": "cd"'])
def test_a_checkpoint_file_needs_exactly_one_digest(digests):
    text = '{"run_id": "r", "step": 3, "saved_at_ms": 5, "files": [{"path": "m", "size_bytes": 1%s}]}' % digests
    with pytest.raises(ValueError, match="exactly one digest"):
        CheckpointInfo.from_json(text)
    with pytest.raises(ValueError, match="cannot record a 'md5' digest"):
        CheckpointFile.of("m", 1, "md5", "ab")


@pytest.mark.parametrize("bad", ['{"run_id": "r", "state": "paused", "step": 1, "stage": "s", "error": null, "updated_at_ms": 1}',
                                 '{"run_id": "r", "state": "running", "step": "one", "stage": "s", "error": null, "updated_at_ms": 1}',
                                 '{"run_id": "r", "state": "running"}'])
def test_a_document_of_the_wrong_shape_is_a_value_error(bad):
    with pytest.raises(ValueError):
        RunStatus.from_json(bad)
