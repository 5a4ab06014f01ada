"""`track`'s MLflow log of a replayed step: a resume from an older checkpoint trains the
steps after it again, without their stage timings (measured by the live step only); the
step's metrics logged to MLflow are the lake's whole record of it (TRAIN.json merged), so
timings whose log a kill cut in flight in the first run still reach MLflow, once (a point
MLflow has is not logged again)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from rlpipe.orchestration.track import log_step
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import StepManifest
from rlpipe.storage.tracking import Tracker
from tests.flows.runs import tiny_config
from tests.helpers.trajectories import make_trajectories


def test_a_replayed_step_logs_the_timings_its_first_run_stored(tmp_path: Path) -> None:
    config = tiny_config(tmp_path)
    lake, tracker = Lake.open(config.storage.lake_uri), Tracker(config.tracking.mlflow_uri, "rlpipe-test")
    mlflow_run_id = tracker.start_run("replayed", tags={}, params={})
    part = lake.write_part("r1", 3, "00000", make_trajectories("r1", 3, 4))
    lake.commit_step(StepManifest(run_id="r1", step=3, policy_version=2, parts=(part,), rows=4,
                                  metrics=(("reward/mean", 0.5),), committed_at_ms=1_700_000_000_003))
    runtime = SimpleNamespace(config=config, run_id="r1", progress=SimpleNamespace(curriculum=None),
                              records=SimpleNamespace(lake=lake, tracker=tracker, mlflow_run_id=mlflow_run_id))
    # the first run stored the step's update and timings in the lake; its MLflow log was cut
    # after the loss and before the timings
    lake.record_train_metrics("r1", 3, {"train/loss": 1.25, "time/generate_s": 0.5})
    tracker.log_step_metrics(mlflow_run_id, 3, {"train/loss": 1.25}, timestamp_ms=1_700_000_000_003)
    logged = log_step(runtime, 3, {"train/loss": 1.25})  # the replay: the update again, no timings
    tracker.end_run(mlflow_run_id, "FINISHED")
    assert logged["time/generate_s"] == 0.5 and logged["train/loss"] == 1.25 and logged["reward/mean"] == 0.5
    assert [(step, value) for step, value, _ in tracker.metric_history(mlflow_run_id, "time/generate_s")] == [(3, 0.5)]
    assert [(step, value) for step, value, _ in tracker.metric_history(mlflow_run_id, "train/loss")] == [(3, 1.25)]
