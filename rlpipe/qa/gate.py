"""One run of the quality gate on one env: sample tasks, run the checks, measure difficulty.

What it does: `sample_tasks` takes `samples` tasks of each split (train and held-out,
seeded, duplicates dropped); `guarded(env, sandbox)` is a verify that turns an exception
of the env's verifier into an unscored verdict (a finding, not a crash: a verifier must
never raise for model output); `run_gate` runs checks.py's checks and, given a policy
folder, difficulty.py's pass@k, into a QaReport.

What it does not: build envs, sandboxes or files (cli/qa.py and report.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rlpipe.core.records import Task, Verdict, VerdictReason
from rlpipe.qa.checks import VerifyMany, run_checks
from rlpipe.qa.records import QaReport


@dataclass(frozen=True)
class PolicyOptions:
    """How to sample the policy whose difficulty is measured."""

    path: str
    k: int = 4
    samples: int = 8
    max_new_tokens: int = 16  # a one-line answer; raise it for code (--max-new-tokens)
    temperature: float = 1.0
    prompt_format: str = "plain"


def sample_tasks(env: object, samples: int, seed: int) -> list[Task]:
    """`samples` tasks of the train split and `samples` of the held-out split, distinct by task_id."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    tasks: dict[str, Task] = {}
    for split in ("train", "heldout"):
        for task in env.tasks(split, samples, seed):  # type: ignore[attr-defined]
            tasks.setdefault(task.task_id, task)
    return list(tasks.values())


VerifyOne = Callable[[object, Task, str, object], Verdict]
"""(env, task, answer text, sandbox or None) -> the verdict; never raises for an answer."""


def guarded_verify(env: object, task: Task, text: str, sandbox: object = None) -> Verdict:
    """env.verify, with an exception of the verifier turned into an unscored crash verdict."""
    started = time.perf_counter()
    try:
        return env.verify(task, text, sandbox)  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - a verifier that raises on an answer is a finding
        return Verdict(reward=None, passed=False, reason=VerdictReason.CRASH,
                       detail=f"the verifier raised {type(exc).__name__}: {str(exc)[:150]}",
                       duration_s=time.perf_counter() - started, verifier_version=getattr(env, "verifier_version", ""))


def run_gate(env: object, verify_many: VerifyMany, *, samples: int, seed: int = 0, repeats: int = 3,
             policy: PolicyOptions | None = None) -> QaReport:
    """Every check of the gate on a sample of `env`'s tasks (see checks.py and difficulty.py)."""
    tasks = sample_tasks(env, samples, seed)
    checks = run_checks(env, tasks, verify_many, repeats)
    difficulty, skipped = None, "no --policy given: pass --policy CHECKPOINT (an HF model folder) to measure pass@k"
    if policy is not None:
        from rlpipe.qa.answers import answer_style
        from rlpipe.qa.difficulty import measure_difficulty

        code = any(answer_style(env, task) == "code" for task in tasks)  # a function body spans lines

        difficulty = measure_difficulty(policy.path, tasks, verify_many, k=policy.k, samples=policy.samples,
                                        max_new_tokens=policy.max_new_tokens, temperature=policy.temperature,
                                        prompt_format=policy.prompt_format, seed=seed,
                                        stop=() if code else ("\n",))
        skipped = None
    return QaReport(env=getattr(env, "name", "?"), verifier_version=getattr(env, "verifier_version", ""),
                    task_ids=tuple(task.task_id for task in tasks), checks=checks, difficulty=difficulty,
                    difficulty_skipped=skipped)
