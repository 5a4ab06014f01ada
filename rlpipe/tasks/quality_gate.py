"""Task `quality-gate`: the environment quality gate on every domain of a run, before its
warm start, when the run's config says `qa.before_train = true` (flows/train.py). The gate
itself, its reports and its one-line outcome are the controller's (controller/quality_gate.py);
the task skips a run that already has a checkpoint (it is past its warm start), posts the
reports as a Prefect markdown artifact, and raises QualityGateFailed (not retried, exit 2)
naming the failing checks and where the report is: the run stops before its warm start.
"""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact

from rlpipe.controller.quality_gate import QualityGateFailed, gate_before_train
from rlpipe.controller.runtime import Runtime
from rlpipe.orchestration.stage_options import UNCACHED_STAGE_OPTIONS
from rlpipe.orchestration.track import artifact_key
from rlpipe.qa.report import summary_markdown


@task(name="quality-gate", **UNCACHED_STAGE_OPTIONS)
def quality_gate(runtime: Runtime) -> bool:
    """The gate before the warm start; True when it passed, False when skipped (the run has
    a checkpoint); QualityGateFailed when it failed."""
    records = runtime.records
    run_id = runtime.run_id
    if records.lake.latest_checkpoint(run_id) is not None:
        return False
    outcome = gate_before_train(run_id, records.lake, records.tracker, records.mlflow_run_id, runtime.mixture,
                                runtime.workers.sandbox_pool, runtime.config.qa, runtime.config.seed)
    create_markdown_artifact(key=f"rlpipe-qa-{artifact_key(run_id)}", description=f"Quality gate before training run {run_id}",
                             markdown=summary_markdown(list(outcome.reports), f"Quality gate before training run `{run_id}`", image=False)
                             + f"\nReport files (markdown, JSON, checks.png): `{outcome.report_location}`\n")
    if not outcome.passed:
        failing = next(report.env for report in outcome.reports if not report.passed)
        raise QualityGateFailed(outcome.line, f"see every finding with `rlpipe qa {failing} --config CONFIG`; fix the domain, "
                                "or set qa.before_train = false to train without the gate")
    return True
