"""The code domain in the train flow: a tiny run whose every row is verified in a sandbox of
the run's pool (the verify stage fans out over `SandboxPool.map`), on each backend that can
start here (bwrap; docker when an engine answers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpipe.controller.builders import build_lake
from rlpipe.core.errors import SandboxUnavailable
from rlpipe.core.records import VerdictReason
from rlpipe.envs.code import CodeEnv
from rlpipe.flows.train import train
from rlpipe.storage.query import query_trajectories
from tests.flows.runs import tiny_config
from tests.helpers.docker_engine import require_docker_engine
from tests.sandbox._bwrap_support import require_bwrap

# What the code verifier can say about a completion; sandbox_error (reward None) is not in it.
CODE_REASONS = {VerdictReason.OK, VerdictReason.WRONG, VerdictReason.FORMAT, VerdictReason.CRASH,
                VerdictReason.TIMEOUT, VerdictReason.OOM}


def _require(backend: str) -> None:
    if backend == "bwrap":
        require_bwrap()
        return
    require_docker_engine()


@pytest.mark.parametrize("backend", [pytest.param("bwrap", marks=pytest.mark.bwrap),
                                     pytest.param("docker", marks=pytest.mark.docker)])
def test_tiny_code_run_verifies_every_row_in_the_sandbox(tmp_path: Path, backend: str) -> None:
    _require(backend)
    config = tiny_config(
        tmp_path,
        "envs.domains={code = 1.0}",
        f'sandbox.backend="{backend}"',
        "sandbox.timeout_s=5.0",
        "sandbox.pool_size=2",
        "train.steps=2",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=6",
        "warmstart.steps=1",
        "warmstart.batch_size=2",
        "envs.heldout_size=2",
        "model.max_position_embeddings=2048",  # HumanEval prompts run to ~1,400 characters
    )
    run_id = f"code-{backend}"
    summary = train(config, run_id)
    lake = build_lake(config)
    assert summary.steps_committed == 2
    assert lake.read_status(run_id).state.value == "finished"
    rows = query_trajectories(
        lake, "select domain, reason, reward, verifier_version from trajectories order by step, task_id, sample_idx"
    ).rows
    assert len(rows) == 2 * 2 * 2  # steps x prompts x samples
    version = CodeEnv(timeout_s=5.0).verifier_version
    for domain, reason, reward, verifier_version in rows:
        assert domain == "code"
        assert VerdictReason(reason) in CODE_REASONS, reason
        assert reward in (0.0, 1.0)
        assert verifier_version == version
    assert lake.read_json(run_id, "evals/after_rl.json")["accuracy/code"] in (0.0, 0.5, 1.0)


class _FakePool:
    """SandboxPool's map, with a plain object as the sandbox; records how it was used."""

    def __init__(self) -> None:
        self.items: list[int] = []

    def map(self, fn, items):
        self.items = list(items)
        return [fn("sandbox", item) for item in self.items]


class _Env:
    def __init__(self, name: str, needs_sandbox: bool, reason: VerdictReason) -> None:
        self.name, self.needs_sandbox, self.reason = name, needs_sandbox, reason

    def verify(self, task, text, sandbox=None):
        from rlpipe.core.records import Verdict

        assert (sandbox is not None) == self.needs_sandbox
        reward = None if self.reason is VerdictReason.SANDBOX_ERROR else 1.0
        return Verdict(reward=reward, passed=reward == 1.0, reason=self.reason, detail=f"{self.name}:{text}",
                       duration_s=0.0, verifier_version="v")


def _runtime(code_reason: VerdictReason):
    from types import SimpleNamespace

    envs = {"exact": _Env("exact", False, VerdictReason.OK), "code": _Env("code", True, code_reason)}
    mixture = SimpleNamespace(env_for=lambda task: envs[task.domain])
    return SimpleNamespace(mixture=mixture, workers=SimpleNamespace(sandbox_pool=_FakePool()))


def test_verify_all_sends_only_sandboxed_rows_to_the_pool_and_keeps_row_order() -> None:
    from types import SimpleNamespace

    from rlpipe.controller.verify import verify_all

    runtime = _runtime(VerdictReason.WRONG)
    pairs = [(SimpleNamespace(domain=domain), str(index)) for index, domain in enumerate(["code", "exact", "code", "exact"])]
    verdicts = verify_all(runtime, pairs)
    assert [verdict.detail for verdict in verdicts] == ["code:0", "exact:1", "code:2", "exact:3"]
    assert runtime.workers.sandbox_pool.items == [0, 2]


def test_verify_all_raises_an_infra_error_when_every_sandboxed_row_failed() -> None:
    """A dead backend is retried by Prefect (InfraError), not committed as a step of unscored rows."""
    from types import SimpleNamespace

    from rlpipe.controller.verify import verify_all

    pairs = [(SimpleNamespace(domain="code"), "0"), (SimpleNamespace(domain="exact"), "1")]
    with pytest.raises(SandboxUnavailable, match="sandboxed verifications failed"):
        verify_all(_runtime(VerdictReason.SANDBOX_ERROR), pairs)


def test_verify_rows_are_worth_staging_only_where_a_sandbox_judges_one() -> None:
    """The rollout task stages verify's rows when some row runs in a sandbox (a retry must
    not sandbox it again), not when every row is checked inline or came judged."""
    from types import SimpleNamespace

    from rlpipe.controller.verify import runs_in_sandboxes

    runtime = _runtime(VerdictReason.WRONG)

    def row(domain: str, judged: bool = False) -> SimpleNamespace:
        return SimpleNamespace(task=SimpleNamespace(domain=domain), verdict=object() if judged else None)

    assert runs_in_sandboxes(runtime, [row("exact"), row("code"), row("exact")])
    assert not runs_in_sandboxes(runtime, [row("exact"), row("exact")])
    assert not runs_in_sandboxes(runtime, [row("exact"), row("code", judged=True)])  # an episode's verdict is kept
    assert not runs_in_sandboxes(runtime, [])
