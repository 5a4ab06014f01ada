"""Tasks `qa-env` and `rescore-run`: the quality gate of one env and the re-score of a finished
run, as Prefect tasks for the `rl-qa` and `rl-rescore` flows (flows/offline_checks.py), so
that both can be deployed, started, scheduled and retried from the UI like training.

Each does what its CLI command does (`rlpipe qa ENV`: qa/standalone.py; `rlpipe rescore RUN`:
controller/rescore.py) and leaves a markdown artifact on its flow run: the gate's checks and
findings, or the flips by domain. An infrastructure error (a sandbox backend, the lake) is
retried like a stage; anything else (an unknown env, run or domain) fails at once.

Not here: report files or an MLflow run for the gate (`rlpipe qa --out/--mlflow` writes
those), nor anything that changes a run (a rescore only adds its own table).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact

from rlpipe.controller.agent_episodes import gate_verify
from rlpipe.controller.builders import build_lake
from rlpipe.controller.rescore import RescoreSummary, rescore_run
from rlpipe.core.config import load_config
from rlpipe.core.errors import UserError
from rlpipe.orchestration.stage_options import UNCACHED_STAGE_OPTIONS
from rlpipe.orchestration.track import artifact_key
from rlpipe.qa.report import summary_markdown
from rlpipe.qa.standalone import GateRequest, gate_env


class GateFailed(UserError):
    """The quality gate found a problem in the env (its flow run ends Failed: a CI can gate on it)."""


@dataclass(frozen=True)
class EnvGateOutcome:
    """What `qa-env` returns: the verdict and the count of findings per check."""

    env: str
    passed: bool
    verifier_version: str
    findings_by_check: dict[str, int]


@task(name="qa-env", task_run_name="qa-{env}", **UNCACHED_STAGE_OPTIONS)
def qa_env(env: str, samples: int, repeats: int, seed: int, backend: str, config_path: str | None) -> EnvGateOutcome:
    """Gate one env; a markdown artifact with every check; GateFailed when a check fails."""
    report = gate_env(GateRequest(env=env, samples=samples, repeats=repeats, seed=seed, backend=backend,
                                  config_path=Path(config_path) if config_path else None), verify_one=gate_verify)
    create_markdown_artifact(key=f"rlpipe-qa-{artifact_key(env)}", description=f"Quality gate of env {env}",
                             markdown=summary_markdown([report], f"Quality gate of env `{env}`", image=False))
    if not report.passed:
        failing = ", ".join(check.name for check in report.checks if not check.passed)
        raise GateFailed(f"env {env!r} failed the quality gate: {failing} ({len(report.findings)} findings)",
                         f"every finding is in the flow run's artifact; `rlpipe qa {env}` prints them too")
    return EnvGateOutcome(env=env, passed=True, verifier_version=report.verifier_version,
                       findings_by_check={check.name: len(check.findings) for check in report.checks})


@task(name="rescore-run", task_run_name="rescore-{run_id}", **UNCACHED_STAGE_OPTIONS)
def rescore(run_id: str, lake_uri: str, env: str | None, backend: str | None, use_cache: bool) -> RescoreSummary:
    """Re-verify a run's committed trajectories into a new verdict table; a markdown artifact of the flips."""
    lake = build_lake(load_config(None, [f"storage.lake_uri={lake_uri!r}"]), create=False)
    summary = rescore_run(lake, run_id, env=env, backend=backend, use_cache=use_cache)
    lines = [f"# Rescore `{summary.rescore_id}` of run `{run_id}`", "",
             f"{summary.rows} rows, {summary.verified} verified, {summary.cached} from the cache: **{summary.flipped} flipped**.", "",
             "| domain | verifier then | now | rows | pass->fail | fail->pass |", "|---|---|---|---|---|---|"]
    lines += [f"| {domain.domain} | {', '.join(domain.stored_versions) or '-'} | {domain.current_version} | {domain.rows} | "
              f"{domain.pass_to_fail} | {domain.fail_to_pass} |" for domain in summary.domains]
    lines += ["", f"Query it: `rlpipe query --lake {summary.lake_uri} \"select * from rescores where rescore_id = "
              f"'{summary.rescore_id}' and flip is not null\"`"]
    create_markdown_artifact(key=f"rlpipe-rescore-{artifact_key(run_id)}", description=f"Rescore of run {run_id}",
                             markdown="\n".join(lines))
    return summary
