"""The `rl-qa` and `rl-rescore` flows (flows/offline_checks.py) on the session's Prefect server:
the gate passes a shipped env and fails its flow run on a broken one, each leaving its report
as a Prefect artifact; the rescore flow commits a new verdict table after a verifier change
and reports the flips. The checks themselves are tested where they live (tests/qa,
tests/storage/test_rescore.py); here, that the flows run them and say so in Prefect. The
deployments that serve them are registered by `rlpipe up` (tests/cli/test_up_serves_train.py)."""

from __future__ import annotations

import asyncio

from prefect.client.orchestration import get_client

from rlpipe.envs import mixture
from rlpipe.flows.offline_checks import rl_qa, rl_rescore
from rlpipe.storage.lake import Lake
from rlpipe.storage.rescores import RescoreStore
from tests.qa.test_qa_gate import UnsolvableEnv  # importing it registers the broken envs
from tests.storage.test_rescore import RUN, NumericArithmetic, finished_run  # noqa: F401 - a fixture


def test_rl_qa_passes_a_shipped_env_and_leaves_its_report_as_an_artifact(prefect_api_url: str) -> None:
    outcome = rl_qa("arithmetic", samples=3)
    assert outcome.passed and outcome.findings_by_check == {"solvability": 0, "consistency": 0, "probes": 0}
    assert "Verdict: **PASSED**" in asyncio.run(_artifact("rlpipe-qa-arithmetic"))


def test_rl_qa_fails_its_flow_run_on_a_broken_env_naming_the_check(prefect_api_url: str) -> None:
    state = rl_qa("qa_broken_unsolvable", samples=3, return_state=True)
    assert state.is_failed() and "solvability" in state.message, state
    report = asyncio.run(_artifact("rlpipe-qa-qa-broken-unsolvable"))
    assert "Verdict: **FAILED**" in report and UnsolvableEnv().tasks("train", 3, 0)[0].task_id in report


def test_rl_rescore_commits_a_new_table_and_reports_the_flips(finished_run, monkeypatch, prefect_api_url: str) -> None:
    monkeypatch.setitem(mixture._REGISTRY, "arithmetic", NumericArithmetic)  # the verifier changed since the run
    summary = rl_rescore(RUN, str(finished_run))
    assert (summary.rows, summary.flipped) == (10, 4)  # as `rlpipe rescore` finds (tests/storage/test_rescore.py)
    assert [m.rescore_id for m in RescoreStore(Lake.open(str(finished_run))).manifests(RUN)] == [summary.rescore_id]
    report = asyncio.run(_artifact(f"rlpipe-rescore-{RUN}"))
    assert "**4 flipped**" in report and "| arithmetic |" in report and "numeric-v2" in report


async def _artifact(key: str) -> str:
    """The newest markdown of the artifact `key` (the session's server; several tests may make one)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async with get_client() as client:
        found = await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert found, f"no artifact {key}"
    return max(found, key=lambda artifact: artifact.created).data
