"""Retention (storage/checkpoint_retention.py): what a run keeps of its checkpoints, and the
deletes on a real lake folder (a partial folder is never taken for a checkpoint)."""

from __future__ import annotations

from pathlib import Path

from rlpipe.storage.checkpoint_retention import RetentionRule, best_step, kept_checkpoints, kept_reasons, prune_checkpoints
from rlpipe.storage.lake import Lake

STEPS = [0, 4, 8, 12, 16, 20]


def test_the_newest_the_best_and_nothing_else() -> None:
    kept = kept_reasons(STEPS, 20, {0: 0.1, 8: 0.6, 20: 0.5}, RetentionRule(2, 0, False))
    assert kept == {8: ("best",), 16: ("last",), 20: ("last", "resume")}


def test_a_pipelined_run_keeps_its_restore_target_and_kl_keeps_checkpoint_0() -> None:
    # committed up to 22 with max_staleness 4: a resume restores at or before step 18 -> 16
    kept = kept_reasons(STEPS, 22, {}, RetentionRule(1, 4, True))
    assert kept == {0: ("reference",), 16: ("resume",), 20: ("last",)}


def test_keep_last_0_keeps_every_checkpoint_and_ties_go_to_the_newer() -> None:
    assert set(kept_reasons(STEPS, 20, {}, RetentionRule(0, 0, False))) == set(STEPS)
    assert best_step(STEPS, {4: 0.5, 12: 0.5, 0: 0.1}) == 12
    assert best_step(STEPS, {}) is None


def test_prune_deletes_only_what_is_not_kept_and_never_the_newest(tmp_path: Path) -> None:
    lake = Lake.open(str(tmp_path / "lake"))
    source = tmp_path / "files"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"w" * 100)
    for step in STEPS:
        lake.save_checkpoint("r", step, source)
    lake.write_json("r", "evals/step_000008.json", {"policy_version": 8, "accuracy": 0.9})
    lake.objects.put("checkpoints/r/step=000024/model.safetensors", b"partial")  # a killed write
    removed = prune_checkpoints(lake, "r", RetentionRule(2, 0, False))
    assert removed == [0, 4, 12]
    assert lake.checkpoint_steps("r") == [8, 16, 20]
    assert [(c.step, c.size_bytes, c.accuracy, c.reasons) for c in kept_checkpoints(lake, "r", RetentionRule(2, 0, False))] == [
        (8, 100, 0.9, ("best",)), (16, 100, None, ("last",)), (20, 100, None, ("last",))]
    assert lake.checkpoints.remove_partial("r") == [24]
    assert lake.checkpoints.listed_steps("r") == [8, 16, 20] and lake.latest_checkpoint("r") == 20
