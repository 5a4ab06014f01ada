"""The environment quality gate (rlpipe/qa, `rlpipe qa`) on every domain of a run, before
its warm start: the controller's plain code of the `quality-gate` task (tasks/quality_gate.py),
no Prefect.

What it does: runs the gate's checks (solvability, verifier consistency, reward-hack probes;
no difficulty: there is no policy yet) on `qa.samples` tasks of each split of each domain,
verifying through the run's own verifiers and sandbox pool (controller/verify_batch.py); writes
the reports (markdown, JSON, a PNG of the checks) to the run's MLflow run as artifacts under
qa/ and each domain's JSON report into the lake (runs/RUN/qa/before_train/DOMAIN.json), with
a one-line outcome in runs/RUN/qa/before_train.json that `rlpipe train` prints.
QualityGateFailed (a UserError: not retried, exit 2) is what the task raises when it failed.

What it does not: decide whether the gate runs (the run's config, a checkpoint: the task),
post the Prefect artifact (the task), measure difficulty (`rlpipe qa ENV --policy` does), or
decide what a check means (rlpipe/qa/checks.py).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rlpipe.controller.agent_episodes import gate_verify
from rlpipe.controller.verify_batch import verify_batch
from rlpipe.core.config import QaConfig
from rlpipe.core.errors import UserError
from rlpipe.envs.mixture import Mixture
from rlpipe.qa.gate import run_gate
from rlpipe.qa.records import QaReport
from rlpipe.qa.report import write_gate_reports
from rlpipe.storage.lake import Lake
from rlpipe.storage.tracking import Tracker

OUTCOME_DOCUMENT = "qa/before_train.json"  # read by cli/progress.py
MLFLOW_FOLDER = "qa"


class QualityGateFailed(UserError):
    """The quality gate before training found a problem in a domain."""


@dataclass(frozen=True)
class GateOutcome:
    """What the gate before training found, and where its report is."""

    passed: bool
    line: str  # one line for the terminal
    reports: tuple[QaReport, ...]
    report_location: str  # the MLflow artifact folder (markdown + PNG)


def gate_domains(mixture: Mixture, sandbox_pool: object | None, qa: QaConfig, seed: int) -> tuple[QaReport, ...]:
    """The gate's checks on every domain of the mixture with a ratio > 0, one report each."""
    def verify_many(pairs):
        return verify_batch(mixture, sandbox_pool, pairs, verify_one=gate_verify)

    return tuple(run_gate(env, verify_many, samples=qa.samples, seed=seed, repeats=qa.repeats)
                 for name, env in sorted(mixture.envs.items()) if mixture.ratios[name] > 0)


def outcome_line(reports: tuple[QaReport, ...], report_location: str) -> str:
    """One line: the verdict, the domains, what failed (check and first finding), the report."""
    verifications = sum(check.verifications for report in reports for check in report.checks)
    if all(report.passed for report in reports):
        return (f"quality gate passed: {', '.join(report.env for report in reports)} "
                f"({verifications} verifications, 0 findings); report: {report_location}")
    failed = []
    for report in (report for report in reports if not report.passed):
        checks = [check for check in report.checks if not check.passed]
        first = checks[0].findings[0]
        failed.append(f"domain {report.env!r} failed {', '.join(check.name for check in checks)} "
                      f"({len(report.findings)} findings; first: task {first.task_id} {first.answer}: {first.problem})")
    return f"quality gate failed before training: {'; '.join(failed)}; report: {report_location}"


def gate_before_train(run_id: str, lake: Lake, tracker: Tracker, mlflow_run_id: str, mixture: Mixture,
                      sandbox_pool: object | None, qa: QaConfig, seed: int) -> GateOutcome:
    """Run the gate, store its reports (MLflow artifacts, the lake) and its one-line outcome."""
    reports = gate_domains(mixture, sandbox_pool, qa, seed)
    location = tracker.artifact_uri(mlflow_run_id, MLFLOW_FOLDER)
    with tempfile.TemporaryDirectory(prefix="rlpipe-qa-") as folder:
        for path in write_gate_reports(list(reports), Path(folder), f"Quality gate before training run `{run_id}`"):
            parent = path.parent.relative_to(folder).as_posix()
            tracker.log_artifact(mlflow_run_id, path, MLFLOW_FOLDER if parent == "." else f"{MLFLOW_FOLDER}/{parent}")
    for report in reports:
        lake.write_json(run_id, f"qa/before_train/{report.env}.json", report.to_dict())
    outcome = GateOutcome(passed=all(report.passed for report in reports), line=outcome_line(reports, location),
                          reports=reports, report_location=location)
    tracker.set_tags(mlflow_run_id, {"rlpipe.qa.before_train": "passed" if outcome.passed else "failed"})
    lake.write_json(run_id, OUTCOME_DOCUMENT, {"passed": outcome.passed, "line": outcome.line,
                                               "report": location, "checked_at_ms": int(time.time() * 1000)})
    return outcome
