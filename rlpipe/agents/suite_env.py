"""A terminal-task suite (Harbor-format folders, what `rlpipe eval --tasks DIR` runs) seen as an
env, so the quality gate (`rlpipe qa suite [--tasks DIR]`) can check it like any domain.

What it does:
- `SuiteEnv(folder, backend)`: the runnable tasks of the folder (the built-in suite when none
  is given). `tasks("train", count, seed)` draws `count` of them (seeded, sorted by id; a
  suite has no held-out split: "heldout" gives none). Each Task's reference answer is
  "oracle", its one known-wrong answer "noop".
- `verify(task, answer)` runs ONE REAL TRIAL (agents/trial.py, the backend's own sandboxes,
  the task's own tests and verifier): "oracle" runs solution/solve.sh, "noop" submits at
  once, any other answer is a scripted episode (a JSON list of tool-call replies, as the
  gate's hostile-agent probes of qa/agent_probes.py are). The verdict's reward is the
  trial's; a trial that ended in infrastructure (sandbox, engine, setup) or was not run is
  unscored (reward None), which the gate reports: an agent must not be able to turn its
  failure into infrastructure. The detail starts with the trial's verdict.
- `qa_terminal_tasks = True` asks the gate for the hostile-agent probes on every task.

What it does not: record trials in the lake or MLflow (`rlpipe eval` does), retry, or run
tasks in parallel (one trial at a time; the gate samples a few tasks).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from rlpipe.agents.agents import ScriptedAgent, noop_agent, oracle_agent
from rlpipe.agents.records import TrialVerdict
from rlpipe.agents.task_format import AgentTask, builtin_suite_dir, load_tasks
from rlpipe.agents.trial import run_trial
from rlpipe.core.records import Task, Verdict, VerdictReason, VerifierSpec

SUITE_KIND = "terminal_task"
ORACLE, NOOP = "oracle", "noop"
DETAIL_CHARS = 300


class SuiteEnv:
    """Harbor-format tasks judged by real trials (see the module docstring)."""

    needs_sandbox = False  # each trial opens its own sandboxes
    qa_terminal_tasks = True
    qa_accepted_variants: tuple[str, ...] = ()

    def __init__(self, folder: Path | None = None, backend: str = "bwrap") -> None:
        self.folder = folder if folder is not None else builtin_suite_dir()
        self.name = "suite" if folder is None else f"suite:{self.folder.name}"
        self.backend = backend
        loaded = load_tasks(self.folder)
        self.runnable = {task.task_id: task for task in loaded if isinstance(task, AgentTask)}
        self.skipped = {task.task_id: task.reason for task in loaded if not isinstance(task, AgentTask)}
        self.verifier_version = f"{backend}-trials"

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        if split != "train":
            return []
        ids = sorted(self.runnable)
        chosen = sorted(random.Random(f"suite:{seed}").sample(ids, min(count, len(ids))))
        return [self._task(self.runnable[task_id]) for task_id in chosen]

    def qa_variant_answers(self, task: Task) -> list[tuple[str, str]]:
        return []

    def qa_wrong_answers(self, task: Task) -> list[str]:
        return [NOOP]

    def qa_probe_answers(self, task: Task) -> list[tuple[str, str]]:
        return []  # the gate adds qa/agent_probes.py's hostile episodes (qa_terminal_tasks)

    def verify(self, task: Task, completion_text: str, sandbox: object = None) -> Verdict:
        """One trial of `task` played as `completion_text` says (see the module docstring)."""
        started = time.perf_counter()
        agent_task = self.runnable[task.task_id]
        if completion_text == ORACLE:
            factory = oracle_agent
        elif completion_text == NOOP:
            factory = noop_agent
        else:
            replies = _replies(completion_text)
            factory = lambda _task: ScriptedAgent(list(replies))  # noqa: E731
        trial = run_trial(agent_task, "qa", factory, self.backend)
        family = trial.verdict.family
        scored = family == "agent" and trial.reward is not None
        reason = (VerdictReason.OK if trial.verdict is TrialVerdict.PASSED else
                  VerdictReason.TIMEOUT if trial.verdict is TrialVerdict.VERIFIER_TIMEOUT else
                  VerdictReason.WRONG if scored else VerdictReason.SANDBOX_ERROR)
        reward = trial.reward if scored else None
        return Verdict(reward=reward, passed=trial.verdict is TrialVerdict.PASSED, reason=reason,
                       detail=f"{trial.verdict.value} ({family}): {trial.detail}"[:DETAIL_CHARS],
                       duration_s=time.perf_counter() - started, verifier_version=self.verifier_version)

    def _task(self, task: AgentTask) -> Task:
        return Task(task_id=task.task_id, domain=self.name, prompt=task.instruction,
                    verifier=VerifierSpec(kind=SUITE_KIND, payload=json.dumps({"folder": str(task.folder)})),
                    reference_answer=ORACLE if task.solution_files.get("solve.sh") else None,
                    metadata=(("split", "train"),))


def _replies(text: str) -> list[str]:
    """A JSON list of replies, or the text as one reply."""
    try:
        replies = json.loads(text)
    except ValueError:
        return [text]
    return replies if isinstance(replies, list) and all(isinstance(reply, str) for reply in replies) else [text]
