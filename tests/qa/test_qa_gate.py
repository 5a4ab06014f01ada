"""`rlpipe qa ENV`: every shipped env passes the gate, and each deliberately broken env is
caught by the check meant for it (exit 1); bad input is exit 2.

The broken envs wrap ArithmeticEnv (composition) and are registered with register_env, so
the CLI builds them by name like any domain:
- unsolvable: one task's reference answer is not the answer (solvability names that task);
- accepts everything: reward 1 for any output (consistency: known-wrong answers score > 0);
- inconsistent: a seeded coin flip per verification (consistency: repeats disagree);
- echo-fooled: any output holding the prompt passes (probes: the prompt echoed scores 1).
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlpipe.cli.main import app
from rlpipe.core.records import Task, Verdict, VerdictReason
from rlpipe.envs.arithmetic import ArithmeticEnv
from rlpipe.envs.mixture import register_env

runner = CliRunner()
RG_CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "reasoning_gym.toml")


class _Wrapped:
    """ArithmeticEnv's tasks and verifier, each broken env changes one of them."""

    needs_sandbox = False

    def __init__(self, name: str) -> None:
        self.name = name
        self.inner = ArithmeticEnv(max_operand=20)
        self.verifier_version = "broken-" + name

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        return [replace(task, domain=self.name) for task in self.inner.tasks(split, count, seed)]

    def verify(self, task: Task, completion_text: str, sandbox=None) -> Verdict:
        return self.inner.verify(task, completion_text, sandbox)


class UnsolvableEnv(_Wrapped):
    """The first train task's reference answer is "nope", which its verifier never accepts."""

    def __init__(self) -> None:
        super().__init__("qa_broken_unsolvable")

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        tasks = super().tasks(split, count, seed)
        if split == "train" and tasks:
            tasks[0] = replace(tasks[0], reference_answer="nope")
        return tasks


class AcceptsEverythingEnv(_Wrapped):
    def __init__(self) -> None:
        super().__init__("qa_broken_accepts_everything")

    def verify(self, task: Task, completion_text: str, sandbox=None) -> Verdict:
        return Verdict(reward=1.0, passed=True, reason=VerdictReason.OK, verifier_version=self.verifier_version)


class InconsistentEnv(_Wrapped):
    def __init__(self) -> None:
        super().__init__("qa_broken_inconsistent")
        self.coin = random.Random(0)

    def verify(self, task: Task, completion_text: str, sandbox=None) -> Verdict:
        verdict = super().verify(task, completion_text, sandbox)
        if verdict.passed and self.coin.random() < 0.5:
            return Verdict(reward=0.0, passed=False, reason=VerdictReason.WRONG, verifier_version=self.verifier_version)
        return verdict


class EchoFooledEnv(_Wrapped):
    def __init__(self) -> None:
        super().__init__("qa_broken_echo")

    def verify(self, task: Task, completion_text: str, sandbox=None) -> Verdict:
        if completion_text.strip() == task.prompt:
            return Verdict(reward=1.0, passed=True, reason=VerdictReason.OK, verifier_version=self.verifier_version)
        return super().verify(task, completion_text, sandbox)


for factory in (UnsolvableEnv, AcceptsEverythingEnv, InconsistentEnv, EchoFooledEnv):
    register_env(factory().name, factory)


def qa(tmp_path, *args):
    result = runner.invoke(app, ["qa", *args, "--out", str(tmp_path / "report"), "--json"])
    report = json.loads(result.stdout) if result.exit_code in (0, 1) else None
    return result, report


def failing_checks(report) -> set[str]:
    return {check["name"] for check in report["checks"] if not check["passed"]}


@pytest.mark.parametrize("env", ["arithmetic", "reverse", "arithmetic_chat", "arithmetic_chat_equation"])
def test_every_shipped_text_env_passes_the_gate(tmp_path, env):
    result, report = qa(tmp_path, env, "--samples", "4")
    assert result.exit_code == 0, result.output
    assert report["passed"] and report["findings"] == []
    # 4 train + 4 held-out tasks, each reference verified 3 times (--repeats default): 8 * 3 = 24
    assert len(report["tasks"]) == 8
    assert next(check for check in report["checks"] if check["name"] == "solvability")["verifications"] == 24
    assert report["difficulty"] is None and "--policy" in report["difficulty_skipped"]
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "**PASSED**" in markdown and "Skipped: no --policy given" in markdown


def test_a_reasoning_gym_domain_from_a_config_passes_the_gate(tmp_path):
    result, report = qa(tmp_path, "rg_spell_backward", "--config", RG_CONFIG, "--samples", "3")
    assert result.exit_code == 0, result.output
    assert report["passed"] and all(task_id.startswith("rg_spell_backward/") for task_id in report["tasks"])


def test_an_unsolvable_task_is_named_by_solvability(tmp_path):
    result, report = qa(tmp_path, "qa_broken_unsolvable", "--samples", "3")
    assert result.exit_code == 1
    assert failing_checks(report) == {"solvability"}
    unsolvable = UnsolvableEnv().tasks("train", 3, 0)[0].task_id
    assert {finding["task_id"] for finding in report["findings"]} == {unsolvable}


def test_a_verifier_that_accepts_everything_fails_consistency_and_probes(tmp_path):
    result, report = qa(tmp_path, "qa_broken_accepts_everything", "--samples", "2")
    assert result.exit_code == 1
    assert failing_checks(report) == {"consistency", "probes"}
    problems = {finding["problem"] for finding in report["findings"] if finding["check"] == "consistency"}
    assert problems == {"a known-wrong answer scores > 0"}


def test_an_inconsistent_verifier_fails_consistency(tmp_path):
    result, report = qa(tmp_path, "qa_broken_inconsistent", "--samples", "3")
    assert result.exit_code == 1
    assert "consistency" in failing_checks(report)
    assert any("judged differently across 3 repeats" in finding["problem"] for finding in report["findings"])


def test_a_verifier_an_echo_fools_fails_the_probes(tmp_path):
    result, report = qa(tmp_path, "qa_broken_echo", "--samples", "2")
    assert result.exit_code == 1
    assert failing_checks(report) == {"probes"}
    assert {finding["answer"] for finding in report["findings"]} == {"probe:prompt_echoed"}
    assert "FAILED" in (tmp_path / "report" / "report.md").read_text()


@pytest.mark.parametrize(("args", "expected"), [
    (["no_such_env"], "unknown domain 'no_such_env'"),
    (["arithmetic", "--samples", "0"], "--samples must be >= 1, got 0"),
    (["arithmetic", "--repeats", "1"], "--repeats must be >= 2"),
    (["arithmetic", "--policy", "/nonexistent/policy"], "is not a folder"),
    (["rg_nope", "--config", RG_CONFIG], "unknown domain 'rg_nope'"),
])
def test_bad_input_is_exit_2_with_a_clear_error(tmp_path, args, expected):
    result = runner.invoke(app, ["qa", *args, "--out", str(tmp_path / "report")])
    assert result.exit_code == 2, result.output
    assert expected in result.output and "Traceback" not in result.output
