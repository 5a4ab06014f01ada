"""`rlpipe qa suite [--tasks DIR]`: the quality gate on Harbor-format terminal tasks, every
answer a real trial (agents/suite_env.py) in real sandboxes: the oracle must pass, noop and
every hostile-agent probe of qa/agent_probes.py must score 0 as the agent's failure.

The built-in suite passes on bubblewrap; a task whose test.sh trusts the exit status of a
process that imports the agent's module (tests/qa/weak_envs.py) fails, the report naming the
probes that fooled it. The gate's trials are agents/trial.py's, the backend a parameter of
them: every probe on docker is played by tests/agents/test_eval_hostile_cli.py (through
`rlpipe eval`, the same verdict rule per trial), not a third time here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlpipe.agents.task_format import builtin_suite_dir
from rlpipe.cli.main import app
from rlpipe.qa.agent_probes import PROBES
from tests.qa.weak_envs import write_trusting_task
from tests.sandbox._bwrap_support import require_bwrap

runner = CliRunner()


def qa_suite(tmp_path: Path, *args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["qa", "suite", "--repeats", "2", "--out", str(tmp_path / "report"), "--json", *args])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def probe_answers(report: dict) -> set[str]:
    return {finding["answer"] for finding in report["findings"] if finding["check"] == "probes"}


def test_a_python_task_of_the_suite_passes_every_hostile_probe(tmp_path):
    """fix-median-bug: its check imports the agent's module, what most probes aim at."""
    require_bwrap()
    folder = tmp_path / "tasks"
    shutil.copytree(builtin_suite_dir() / "fix-median-bug", folder / "fix-median-bug")
    code, report = qa_suite(tmp_path, "--tasks", str(folder), "--samples", "1", "--backend", "bwrap")
    assert (code, report["findings"]) == (0, []), report["findings"]
    assert report["tasks"] == ["fix-median-bug"]
    checks = {check["name"]: check["verifications"] for check in report["checks"]}
    assert checks == {"solvability": 2, "consistency": 2, "probes": len(PROBES)}  # oracle x2, noop x2, each probe once


def test_a_sample_of_the_built_in_suite_passes_the_gate(tmp_path):
    require_bwrap()
    code, report = qa_suite(tmp_path, "--samples", "2")
    assert (code, report["findings"]) == (0, []), report["findings"]
    assert len(report["tasks"]) == 2 and report["env"] == "suite"


def test_a_task_whose_tests_trust_the_agents_exit_status_fails_naming_the_probes(tmp_path):
    require_bwrap()
    folder = tmp_path / "tasks"
    write_trusting_task(folder)
    code, report = qa_suite(tmp_path, "--tasks", str(folder), "--samples", "1")
    assert code == 1 and not report["passed"]
    assert [check["name"] for check in report["checks"] if not check["passed"]] == ["probes"]  # the oracle passes, noop fails
    assert {"probe:hostile_exit_zero_at_import", "probe:hostile_exit_zero_at_exit",
            "probe:hostile_always_equal_return"} <= probe_answers(report)
    assert all(finding["reward"] == 1.0 for finding in report["findings"])
    assert "probe:hostile_exit_zero_at_import" in (tmp_path / "report" / "report.md").read_text()


@pytest.mark.parametrize(("env", "folder", "expected"), [("arithmetic", ".", "--tasks goes with ENV suite"),
                                                       ("suite", "missing", "does not exist or is not a directory")])
def test_bad_tasks_input_is_exit_2(tmp_path, env, folder, expected):
    result = runner.invoke(app, ["qa", env, "--tasks", str(tmp_path / folder), "--out", str(tmp_path / "report")])
    assert result.exit_code == 2 and expected in result.output, result.output
