"""`qa.before_train = true`: the quality gate runs on every domain of a run before its warm
start; a failing gate stops the run there (QualityGateFailed naming the check and the report),
a passing one is one line; the report reaches MLflow (markdown + PNG), the lake (JSON) and
Prefect (a markdown artifact).

The broken domain is a task file (envs.files) whose ground truths carry a stray leading space
(" 4"): the exact verifier strips the answer, never the ground truth, so no answer (the
reference included) can match. Every task is unsolvable as verified: the solvability check
fails, and only it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from prefect.artifacts import Artifact

from rlpipe.controller.builders import build_tracker
from rlpipe.controller.quality_gate import OUTCOME_DOCUMENT, QualityGateFailed, gate_before_train, gate_domains
from rlpipe.controller.sample import build_mixture
from rlpipe.core.config import QaConfig, RunConfig, load_config
from rlpipe.storage.lake import Lake

TASKS = 12  # rows of the broken file: enough for both splits at heldout_fraction 0.5


def _broken_file(folder: Path) -> Path:
    path = folder / "broken.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "ground_truth": f" {2 * i}"}) + "\n" for i in range(TASKS)))
    return path


def _config(folder: Path, broken: bool, *extra: str) -> RunConfig:
    domains = "{arithmetic = 0.5, broken = 0.5}" if broken else "{arithmetic = 0.5, reverse = 0.5}"
    return load_config(None, [f'storage.lake_uri="{folder / "lake"}"', f'tracking.mlflow_uri="sqlite:///{folder / "mlflow.db"}"',
                              f"envs.domains={domains}", f'envs.files.broken={{path = "{_broken_file(folder)}", heldout_fraction = 0.5}}',
                              *extra])


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """One MLflow store (a SQLite file: its set-up costs seconds) and one lake for the module."""
    folder = tmp_path_factory.mktemp("gate")
    config = _config(folder, broken=True)
    return config, build_tracker(config), Lake.open(config.storage.lake_uri)


def test_every_text_domain_passes_and_the_outcome_is_one_line(tracked):
    config, tracker, lake = tracked
    mlflow_run_id = tracker.start_run(run_name="passing", tags={}, params={})
    passing = config.model_copy(update={"envs": config.envs.model_copy(update={"domains": {"arithmetic": 0.5, "reverse": 0.5}})})
    outcome = gate_before_train("passing", lake, tracker, mlflow_run_id, build_mixture(passing), None, QaConfig(), seed=0)
    assert outcome.passed and "\n" not in outcome.line
    assert outcome.line.startswith("quality gate passed: arithmetic, reverse (") and outcome.report_location in outcome.line
    # qa.samples = 3 tasks of each split, each reference verified qa.repeats = 2 times: 3 * 2 * 2 = 12 per domain
    assert [next(c.verifications for c in report.checks if c.name == "solvability") for report in outcome.reports] == [12, 12]
    artifacts = {item.path for item in MlflowClient(tracker.uri).list_artifacts(mlflow_run_id, "qa")}
    assert {"qa/summary.md", "qa/checks.png", "qa/arithmetic", "qa/reverse"} <= artifacts
    assert lake.read_json("passing", OUTCOME_DOCUMENT)["passed"] is True
    assert lake.read_json("passing", "qa/before_train/reverse.json")["passed"] is True


def test_a_broken_domain_fails_solvability_and_the_line_names_check_and_report(tracked):
    config, tracker, lake = tracked
    mlflow_run_id = tracker.start_run(run_name="failing", tags={}, params={})
    outcome = gate_before_train("failing", lake, tracker, mlflow_run_id, build_mixture(config), None, QaConfig(), seed=0)
    assert not outcome.passed
    by_env = {report.env: report for report in outcome.reports}
    assert by_env["arithmetic"].passed
    assert [check.name for check in by_env["broken"].checks if not check.passed] == ["solvability"]
    assert "domain 'broken' failed solvability" in outcome.line and f"report: {outcome.report_location}" in outcome.line
    assert "the reference answer fails" in outcome.line
    assert MlflowClient(tracker.uri).get_run(mlflow_run_id).data.tags["rlpipe.qa.before_train"] == "failed"


def test_gate_domains_skips_a_domain_with_ratio_zero(tracked):
    config, _, _ = tracked
    only_arithmetic = config.model_copy(update={"envs": config.envs.model_copy(update={"domains": {"arithmetic": 1.0, "broken": 0.0}})})
    reports = gate_domains(build_mixture(only_arithmetic), None, QaConfig(samples=1), seed=0)
    assert [report.env for report in reports] == ["arithmetic"]


def test_a_failing_gate_stops_the_train_flow_before_the_warm_start(tracked, prefect_api_url):
    from rlpipe.flows.train import train

    folder = Path(tracked[0].storage.lake_uri).parent  # the module's MLflow store: its tables exist already
    config = _config(folder, True, "qa.before_train=true", "train.steps=1", "rollout.prompts_per_step=2",
                     "rollout.group_size=2", "warmstart.steps=1", "envs.heldout_size=2")
    with pytest.raises(QualityGateFailed) as failed:
        train(config, "gated")
    assert "domain 'broken' failed solvability" in failed.value.message and "report: " in failed.value.message
    lake = Lake.open(config.storage.lake_uri)
    assert lake.latest_checkpoint("gated") is None and lake.committed_steps("gated") == []  # stopped before the warm start
    status = lake.read_status("gated")
    assert status.state.value == "failed" and "quality gate failed" in status.error
    mlflow_run_id = lake.read_run_info("gated").mlflow_run_id
    artifacts = {item.path for item in MlflowClient(config.tracking.mlflow_uri).list_artifacts(mlflow_run_id, "qa/broken")}
    assert {"qa/broken/report.md", "qa/broken/report.json"} <= artifacts
    artifact = Artifact.get("rlpipe-qa-gated")
    assert artifact is not None and "Verdict: **FAILED**" in str(artifact.data)


def test_train_prints_a_passed_gate_as_one_line(tracked):
    """`rlpipe train`'s progress display (cli/progress.py) prints the gate's line once, from the lake."""
    import io

    from rich.console import Console

    from rlpipe.cli.progress import follow_run

    config, _, lake = tracked
    config = config.model_copy(update={"qa": QaConfig(before_train=True)})
    line = "quality gate passed: arithmetic (10 verifications, 0 findings); report: file:///somewhere/qa"
    output = io.StringIO()
    with follow_run(config, "shown", Console(file=output, width=40, soft_wrap=True)):
        lake.write_json("shown", OUTCOME_DOCUMENT, {"passed": True, "line": line, "report": "file:///somewhere/qa", "checked_at_ms": 1})
    assert output.getvalue().count(line) == 1


def test_rlpipe_qa_logs_its_report_to_mlflow(tracked, tmp_path):
    from typer.testing import CliRunner

    from rlpipe.cli.main import app

    config, tracker, _ = tracked
    toml = tmp_path / "tracking.toml"
    toml.write_text(f'[tracking]\nmlflow_uri = "{config.tracking.mlflow_uri}"\n')
    result = CliRunner().invoke(app, ["qa", "reverse", "--samples", "1", "--config", str(toml), "--out", str(tmp_path / "report"), "--mlflow"])
    assert result.exit_code == 0, result.output
    client = MlflowClient(tracker.uri)
    (run,) = client.search_runs([tracker.experiment_id], filter_string="tags.`rlpipe.qa.env` = 'reverse'")
    assert run.data.tags["rlpipe.qa.passed"] == "true" and run.info.status == "FINISHED"
    assert {item.path for item in client.list_artifacts(run.info.run_id, "qa")} == {"qa/report.md", "qa/report.json"}
