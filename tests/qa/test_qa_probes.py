"""`rlpipe qa`'s task-independent hack probes: the deliberately weak envs of weak_envs.py fail
the gate, each naming the probes that fooled it, and every env the shipped configs define
still passes (the code env: test_qa_code_and_difficulty.py; agent_tasks:
test_qa_agent_tasks.py; Harbor suites: test_qa_suite.py).

Every answer is a real attempt through the env's own verifier; the in-process code env runs
in real bubblewrap sandboxes.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tests.qa.weak_envs  # noqa: F401 - registers the weak envs, as a plugin would
from rlpipe.cli.main import app
from rlpipe.core.errors import SandboxUnavailable
from rlpipe.envs.code_probes import ANY_TASK_PROBES
from rlpipe.sandbox.base import Limits

runner = CliRunner()
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SANDBOXED = {"code", "agent_tasks"}  # gated by their own tests (sandboxes, slower)


def qa(tmp_path: Path, *args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["qa", *args, "--out", str(tmp_path / "report"), "--json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def fooled_by(report: dict) -> set[str]:
    """The probes that scored > 0 (the answer names a finding of the probes check)."""
    return {finding["answer"] for finding in report["findings"] if finding["check"] == "probes" and finding["reward"]}


def test_a_verifier_that_accepts_any_output_holding_the_answer_fails_on_several_answers(tmp_path):
    code, report = qa(tmp_path, "qa_weak_contains", "--samples", "2")
    assert code == 1 and not report["passed"]
    assert [check["name"] for check in report["checks"] if not check["passed"]] == ["probes"]
    assert {"probe:numbers_around_the_answer", "probe:several_answers_spaces", "probe:prompt_echoed_with_answer",
            "probe:answer_then_junk"} <= fooled_by(report)
    assert "probe:numbers_around_the_answer" in (tmp_path / "report" / "report.md").read_text()


def test_a_verifier_that_accepts_part_of_the_answer_fails_on_partial_answers(tmp_path):
    code, report = qa(tmp_path, "qa_weak_partial", "--samples", "2")
    assert code == 1
    assert [check["name"] for check in report["checks"] if not check["passed"]] == ["probes"]
    assert fooled_by(report) == {"probe:prefix_all_but_last_char", "probe:prefix_half", "probe:suffix_all_but_first_char",
                                 "probe:inner_substring"}


@pytest.mark.bwrap
def test_a_code_verifier_that_runs_the_solution_in_its_own_process_fails_on_the_any_task_probes(tmp_path):
    from rlpipe.sandbox.bwrap import BwrapSandbox

    try:
        BwrapSandbox(Limits()).close()
    except SandboxUnavailable as exc:
        pytest.skip(f"bubblewrap sandboxes cannot start here: {exc.message}")
    code, report = qa(tmp_path, "qa_weak_in_process", "--samples", "1", "--repeats", "2", "--workers", "2")
    assert code == 1
    assert [check["name"] for check in report["checks"] if not check["passed"]] == ["probes"]
    assert all(task_id.startswith("weak_code/") for task_id in report["tasks"])  # no HumanEval id: no targeted attack
    # every attack of ANY_TASK_PROBES works on a verifier that trusts its own exit status
    assert {f"probe:{probe.name}" for probe in ANY_TASK_PROBES} <= fooled_by(report)
    by_task = {finding["task_id"] for finding in report["findings"] if finding["answer"] == "probe:exit_zero_at_import"}
    assert by_task == set(report["tasks"])


def _shipped_text_domains() -> list[tuple[str, str]]:
    """(config file, domain) of every domain the shipped configs train on, sandboxed ones aside."""
    pairs = []
    for path in sorted(CONFIGS.glob("*.toml")):
        domains = tomllib.loads(path.read_text()).get("envs", {}).get("domains", {})
        pairs += [(path.name, domain) for domain in domains if domain not in SANDBOXED]
    return pairs


@pytest.mark.parametrize(("config", "domain"), _shipped_text_domains(), ids=[f"{c}:{d}" for c, d in _shipped_text_domains()])
def test_every_domain_of_every_shipped_config_passes_the_gate(tmp_path, config, domain):
    code, report = qa(tmp_path, domain, "--config", str(CONFIGS / config), "--samples", "1", "--repeats", "2")
    assert (code, report["findings"]) == (0, [])
    probes = next(check for check in report["checks"] if check["name"] == "probes")
    assert probes["verifications"] >= 2 * 15  # 2 tasks, each tried with every text probe that differs from its answer
