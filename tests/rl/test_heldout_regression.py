"""The held-out regression rule (rl/heldout_regression.py) on hand-computed numbers, the
evaluations it is fed from the lake, and the alert it raises (artifact, tag, warning)."""

import asyncio
from types import SimpleNamespace

import pytest
from prefect import flow, get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from rlpipe.core.config import load_config
from rlpipe.rl.heldout_regression import Evaluation, fall_in_standard_errors, find_regressions
from rlpipe.storage.lake import Lake

BEFORE = Evaluation("before_rl", 0, {"a": 0.50, "b": 0.20})
STEP_10 = Evaluation("step_000010", 10, {"a": 0.70, "b": 0.30})
STEP_20 = Evaluation("step_000020", 20, {"a": 0.60, "b": 0.40})


def test_a_fall_of_more_than_the_threshold_below_the_windows_best_is_a_regression():
    now = Evaluation("after_rl", 30, {"a": 0.55, "b": 0.35})
    # a: best of the last 2 = 0.70 (step 10), 0.70 - 0.55 = 0.15 > 0.1; b: best 0.40, 0.40 - 0.35 = 0.05
    (found,) = find_regressions([BEFORE, STEP_10, STEP_20], now, threshold=0.1, window=2)
    assert (found.domain, found.best, found.best_at.name, found.now) == ("a", 0.70, "step_000010", 0.55)
    assert found.drop == pytest.approx(0.15)
    assert "0.700 at step_000010" in found.line() and "0.550 at after_rl" in found.line()


def test_the_window_limits_how_far_back_the_best_is_taken():
    now = Evaluation("after_rl", 30, {"a": 0.55})
    # window 1: only step 20 (0.60): 0.05 is no regression; window 2 reaches 0.70 at step 10
    assert find_regressions([BEFORE, STEP_10, STEP_20], now, threshold=0.1, window=1) == []
    assert [r.domain for r in find_regressions([BEFORE, STEP_10, STEP_20], now, threshold=0.1, window=2)] == ["a"]


def test_a_significant_fall_near_0_1_is_a_regression_that_the_absolute_threshold_misses():
    """A multi-domain run (configs/multidomain.toml, docs/RESULTS.md): rg_sub 0.095 -> 0.020
    on 200 tasks each is (0.075) / sqrt(2 * 0.0575 * 0.9425 / 200) = 3.22 standard errors;
    arithmetic's 0.215 -> 0.135 on the same counts is 2.10: noise at z = 3."""
    best = Evaluation("step_000025", 25, {"rg_sub": 0.095, "arithmetic": 0.215})
    now = Evaluation("step_000050", 50, {"rg_sub": 0.020, "arithmetic": 0.135})
    assert fall_in_standard_errors(0.095, 0.020, 200) == pytest.approx(3.22, abs=0.01)
    assert fall_in_standard_errors(0.215, 0.135, 200) == pytest.approx(2.10, abs=0.01)
    assert find_regressions([best], now, threshold=0.1, window=3) == []  # absolute only: both under 0.1
    (found,) = find_regressions([best], now, threshold=0.1, window=3, z=3.0, tasks=200)
    assert (found.domain, found.best, found.now) == ("rg_sub", 0.095, 0.020)
    # the same fall measured on 40 tasks is within noise (z = 1.44)
    assert find_regressions([best], now, threshold=0.1, window=3, z=3.0, tasks=40) == []


def test_no_fall_or_no_variance_is_zero_standard_errors():
    assert fall_in_standard_errors(0.3, 0.3, 200) == 0.0
    assert fall_in_standard_errors(0.2, 0.4, 200) == 0.0  # a rise
    assert fall_in_standard_errors(0.0, 0.0, 200) == 0.0 and fall_in_standard_errors(1.0, 1.0, 200) == 0.0


def test_no_earlier_evaluation_or_a_new_domain_is_no_regression():
    assert find_regressions([], BEFORE, threshold=0.01, window=3) == []
    assert find_regressions([BEFORE], Evaluation("step_000010", 10, {"c": 0.0}), threshold=0.01, window=3) == []


def test_evaluation_from_evaluates_result_keeps_the_domains():
    evaluation = Evaluation.from_result("x", 3, {"accuracy": 0.5, "accuracy/a": 1.0, "accuracy/b": 0.0})
    assert evaluation.accuracy == {"a": 1.0, "b": 0.0}


def test_heldout_metric_names_and_the_stored_evaluations_in_order(tmp_path):
    from rlpipe.controller.evaluation import earlier_evaluations, heldout_metrics

    assert heldout_metrics({"accuracy": 0.5, "accuracy/a": 1.0}) == {"heldout/accuracy": 0.5, "heldout/a/accuracy": 1.0}
    lake = Lake.open(str(tmp_path / "lake"))
    for name, version, accuracy in (("before_rl", 0, 0.1), ("step_000005", 5, 0.2), ("step_000010", 10, 0.3)):
        lake.write_json("r", f"evals/{name}.json", {"policy_version": version, "accuracy": accuracy, "accuracy/a": accuracy})
    runtime = SimpleNamespace(run_id="r", records=SimpleNamespace(lake=lake), config=load_config(None, ["eval.every_steps=5"]))
    earlier = earlier_evaluations(runtime, Evaluation("step_000010", 10, {"a": 0.3}))
    assert [(e.name, e.policy_version, e.accuracy) for e in earlier] == [("before_rl", 0, {"a": 0.1}), ("step_000005", 5, {"a": 0.2})]


class RecordingTracker:
    def __init__(self):
        self.tags = {}

    def set_tags(self, mlflow_run_id, tags):
        self.tags.update(tags)


def test_the_alert_is_an_artifact_a_tag_and_a_warning(prefect_api_url, caplog):
    from rlpipe.orchestration.track import alert_regressions

    runtime = SimpleNamespace(run_id="Run_1", records=SimpleNamespace(mlflow_run_id="m", tracker=RecordingTracker()),
                              config=load_config(None))
    now = Evaluation("after_rl", 30, {"a": 0.55, "b": 0.35})

    @flow
    def alert():
        alert_regressions(runtime, find_regressions([STEP_10, STEP_20], now, threshold=0.1, window=2))

    alert()
    tags = runtime.records.tracker.tags
    assert list(tags) == ["regression.a"] and "0.700 at step_000010" in tags["regression.a"]
    assert any(record.levelname == "WARNING" and "regression: held-out accuracy of a fell" in record.getMessage()
               for record in caplog.records)
    markdown = asyncio.run(_artifact("rlpipe-regression-run-1"))
    assert "| a | 0.700 (step_000010) | 0.550 | -0.150 |" in markdown


async def _artifact(key: str) -> str:
    async with get_client() as client:
        artifacts = await client.read_latest_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        assert len(artifacts) == 1, artifacts
        return artifacts[0].data
