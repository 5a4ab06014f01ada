"""Typed results of the quality gate: a finding, a check's outcome, difficulty, the report.

What it does: frozen records and their JSON form (`QaReport.to_dict`). What it does not:
run a check or write a file (checks.py, report.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Finding:
    """One problem the gate found: which check, which task, which answer, what the verifier said."""

    check: str
    task_id: str
    answer: str  # what was tried: "reference", "variant:trailing_newline", "wrong:last_char", "probe:empty"
    problem: str  # what is wrong, in words
    reward: float | None = None
    reason: str = ""
    detail: str = ""


@dataclass(frozen=True)
class CheckResult:
    """One check: how many verifications it ran, what it found; `skipped` says why it did not run."""

    name: str
    verifications: int
    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()
    skipped: str | None = None

    @property
    def passed(self) -> bool:
        return not self.findings


@dataclass(frozen=True)
class TaskDifficulty:
    """pass@1 and pass@k of one task from n samples of which `correct` passed."""

    task_id: str
    split: str
    samples: int
    correct: int
    pass_at_1: float
    pass_at_k: float


@dataclass(frozen=True)
class Difficulty:
    """The difficulty section: per-task pass rates of one policy, and their histogram."""

    policy: str
    k: int
    tasks: tuple[TaskDifficulty, ...]
    histogram: tuple[tuple[str, int], ...]  # (bin label, task count), bins of pass@1

    @property
    def mean_pass_at_1(self) -> float:
        return sum(task.pass_at_1 for task in self.tasks) / len(self.tasks) if self.tasks else 0.0

    @property
    def mean_pass_at_k(self) -> float:
        return sum(task.pass_at_k for task in self.tasks) / len(self.tasks) if self.tasks else 0.0


@dataclass(frozen=True)
class QaReport:
    """Everything `rlpipe qa ENV` found; `passed` is the gate's verdict (exit 0 iff True)."""

    env: str
    verifier_version: str
    task_ids: tuple[str, ...]
    checks: tuple[CheckResult, ...]
    difficulty: Difficulty | None = None
    difficulty_skipped: str | None = None

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(finding for check in self.checks for finding in check.findings)

    def to_dict(self) -> dict:
        return {
            "env": self.env, "verifier_version": self.verifier_version, "passed": self.passed,
            "tasks": list(self.task_ids),
            "checks": [{"name": check.name, "passed": check.passed, "verifications": check.verifications,
                        "skipped": check.skipped, "notes": list(check.notes)} for check in self.checks],
            "findings": [asdict(finding) for finding in self.findings],
            "difficulty": None if self.difficulty is None else {
                "policy": self.difficulty.policy, "k": self.difficulty.k,
                "mean_pass_at_1": self.difficulty.mean_pass_at_1, "mean_pass_at_k": self.difficulty.mean_pass_at_k,
                "histogram": dict(self.difficulty.histogram), "tasks": [asdict(task) for task in self.difficulty.tasks]},
            "difficulty_skipped": self.difficulty_skipped,
        }
