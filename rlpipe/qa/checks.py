"""The gate's checks over a sample of an env's tasks, through any batch verifier.

What it does: `run_checks(env, tasks, verify_many, repeats)` builds every attempt
(answers.py) of every check, verifies them in ONE batch (so a sandbox pool fans them out),
and judges the verdicts:
- solvability: each task's reference answer passes (a task without one is a finding);
- consistency: the reference and each known-wrong answer, verified `repeats` times, get the
  same (reward, reason) every time; each accepted formatting variant of a passing
  reference passes; every known-wrong answer scores 0;
- probes: every reward-hack probe scores 0 (and for code, every attack of code_probes.py).
A verdict that could not be scored (reward None: the sandbox failed) is a finding too: the
gate cannot vouch for what it could not run.

What it does not: build sandboxes or envs (the caller's verify_many holds them), or judge
difficulty (difficulty.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from rlpipe.core.records import Task, Verdict
from rlpipe.qa.answers import Attempt, answer_style, code_probe_attempts, probe_attempts, variant_attempts, wrong_attempts
from rlpipe.qa.records import CheckResult, Finding

VerifyMany = Callable[[list[tuple[Task, str]]], list[Verdict]]
SOLVABILITY, CONSISTENCY, PROBES = "solvability", "consistency", "probes"


@dataclass(frozen=True)
class _Run:
    check: str
    attempt: Attempt
    repeat: int


def run_checks(env: object, tasks: list[Task], verify_many: VerifyMany, repeats: int = 3) -> tuple[CheckResult, ...]:
    """Solvability, consistency and probe checks of `tasks` (see the module docstring)."""
    if repeats < 2:
        raise ValueError(f"repeats must be >= 2 to compare verdicts, got {repeats}")
    by_id = {task.task_id: task for task in tasks}
    runs: list[_Run] = []
    missing_reference = [task.task_id for task in tasks if task.reference_answer is None]
    for task in tasks:
        if task.reference_answer is not None:
            runs += [_Run(SOLVABILITY, Attempt(task.task_id, "reference", task.reference_answer), repeat)
                     for repeat in range(repeats)]
        runs += [_Run(CONSISTENCY, attempt, 0) for attempt in variant_attempts(env, task)]
        runs += [_Run(CONSISTENCY, attempt, repeat) for attempt in wrong_attempts(env, task) for repeat in range(repeats)]
        runs += [_Run(PROBES, attempt, 0) for attempt in probe_attempts(env, task)]
    code_attacks = code_probe_attempts(env) if any(_is_code(env, task) for task in tasks) else []
    for attempt in code_attacks:
        by_id.setdefault(attempt.task_id, env.task(attempt.task_id))  # type: ignore[attr-defined]
        runs.append(_Run(PROBES, attempt, 0))
    verdicts = verify_many([(by_id[run.attempt.task_id], run.attempt.text) for run in runs]) if runs else []
    if len(verdicts) != len(runs):
        raise RuntimeError(f"verify_many returned {len(verdicts)} verdicts for {len(runs)} answers")
    results = list(zip(runs, verdicts))
    return (_solvability(results, missing_reference, len(tasks)),
            _consistency(results, tasks, repeats),
            _probes(results, code_attacks))


def _is_code(env: object, task: Task) -> bool:
    return answer_style(env, task) == "code"


def _finding(check: str, run: _Run, problem: str, verdict: Verdict) -> Finding:
    return Finding(check=check, task_id=run.attempt.task_id, answer=run.attempt.name, problem=problem,
                   reward=verdict.reward, reason=verdict.reason.value, detail=verdict.detail[:200])


def _grouped(results: list[tuple[_Run, Verdict]], check: str) -> dict[tuple[str, str], list[tuple[_Run, Verdict]]]:
    groups: dict[tuple[str, str], list[tuple[_Run, Verdict]]] = defaultdict(list)
    for run, verdict in results:
        if run.check == check:
            groups[(run.attempt.task_id, run.attempt.name)].append((run, verdict))
    return groups


def _solvability(results: list[tuple[_Run, Verdict]], missing_reference: list[str], task_count: int) -> CheckResult:
    findings = [Finding(SOLVABILITY, task_id, "reference", "the task has no reference answer: its solvability is unknown")
                for task_id in missing_reference]
    for (_task_id, _name), group in _grouped(results, SOLVABILITY).items():
        run, verdict = group[0]
        if verdict.reward is None:
            findings.append(_finding(SOLVABILITY, run, "the reference answer could not be scored", verdict))
        elif not verdict.passed:
            findings.append(_finding(SOLVABILITY, run, "the reference answer fails: the task is unsolvable as verified", verdict))
    checked = sum(1 for run, _ in results if run.check == SOLVABILITY)
    return CheckResult(SOLVABILITY, checked, tuple(findings), notes=(f"{task_count} tasks",))


def _consistency(results: list[tuple[_Run, Verdict]], tasks: list[Task], repeats: int) -> CheckResult:
    findings: list[Finding] = []
    reference_passes = {key[0] for key, group in _grouped(results, SOLVABILITY).items() if all(v.passed for _, v in group)}
    for check in (SOLVABILITY, CONSISTENCY):
        for group in _grouped(results, check).values():
            judged = {(verdict.reward, verdict.reason.value) for _, verdict in group}
            if len(judged) > 1:
                run, verdict = group[0]
                findings.append(_finding(CONSISTENCY, run, f"the same answer judged differently across {len(group)} "
                                         f"repeats: {sorted(judged, key=str)}", verdict))
    checked = 0
    for run, verdict in results:
        if run.check != CONSISTENCY:
            continue
        checked += 1
        if run.attempt.name.startswith("variant:") and run.attempt.task_id in reference_passes and not verdict.passed:
            findings.append(_finding(CONSISTENCY, run, "the right answer in an accepted formatting variant is rejected", verdict))
        if run.attempt.name.startswith("wrong:") and run.repeat == 0:
            if verdict.reward is None:
                findings.append(_finding(CONSISTENCY, run, "a known-wrong answer could not be scored", verdict))
            elif verdict.reward > 0:
                findings.append(_finding(CONSISTENCY, run, "a known-wrong answer scores > 0", verdict))
    variants = sorted({run.attempt.name for run, _ in results if run.attempt.name.startswith("variant:")})
    notes = (f"{repeats} repeats of each reference and known-wrong answer",
             "accepted variants: " + (", ".join(name.split(":", 1)[1] for name in variants) or
                                      "none declared by the env (variant check skipped)"))
    return CheckResult(CONSISTENCY, checked, tuple(findings), notes=notes)


def _probes(results: list[tuple[_Run, Verdict]], code_attacks: list[Attempt]) -> CheckResult:
    findings = []
    checked = 0
    for run, verdict in results:
        if run.check != PROBES:
            continue
        checked += 1
        if verdict.reward is None:
            findings.append(_finding(PROBES, run, "a reward-hack probe could not be scored", verdict))
        elif verdict.reward > 0:
            findings.append(_finding(PROBES, run, "a reward-hack probe scores > 0: the verifier can be fooled", verdict))
    notes = (f"{len(code_attacks)} code attacks of envs/code_probes.py",) if code_attacks else ()
    return CheckResult(PROBES, checked, tuple(findings), notes=notes)
