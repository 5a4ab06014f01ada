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
    info = CheckpointInfo("r", 3, (CheckpointFile("model.safetensors", 10, "x"), CheckpointFile("a/b.json", 2, "y")), 5)
    assert CheckpointInfo.from_json(info.to_json()) == info
    timed = CheckpointInfo("r", 3, info.files, 5, write_s=1.5, write_cpu_s=0.25)
    assert CheckpointInfo.from_json(timed.to_json()) == timed


@pytest.mark.parametrize("bad", ['{"run_id": "r", "state": "paused", "step": 1, "stage": "s", "error": null, "updated_at_ms": 1}',
                                 '{"run_id": "r", "state": "running", "step": "one", "stage": "s", "error": null, "updated_at_ms": 1}',
                                 '{"run_id": "r", "state": "running"}'])
def test_a_document_of_the_wrong_shape_is_a_value_error(bad):
    with pytest.raises(ValueError):
        RunStatus.from_json(bad)
