"""`rlpipe eval replay TRIAL --from-step K --agent A`: restore the state after step K of a
recorded trial and let another agent go on from there, as a new trial linked to the source.

How the state is restored (why re-execution, not snapshots: agents/tree_state.py): a fresh
sandbox with the task's initial files and setup script, then the recorded calls of steps
1..K run again in order, the /work digest after each compared with the recorded one (a
mismatch: ReplayDiverged, exit 2, nothing recorded). The new agent sees the conversation
as it stood after step K (the replies and the re-executed results) and has the task's
remaining steps (max_steps - K). The new trial is a one-task eval of its own (EVAL.json
with `replay_of` = the source trial id and `replay_from_step` = K), its trial row carries
the same two fields, and its steps.parquet holds the K replayed steps then the new agent's.

`load_replay(store, trial_id, from_step)` finds the trial in the lake, loads its task again
from the source eval's task folder, and checks K: 0 <= K <= the trial's steps, and steps
1..K do not include its submit. What it does not do: run the trial (agents/evaluation.py
run_eval with `replay=`), or resume a replay eval (run the replay again instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlpipe.agents.recording import TrialStore, trial_from_rows
from rlpipe.agents.task_format import AgentTask, SkippedTask, builtin_suite_dir, load_tasks
from rlpipe.agents.tree_state import ReplayPrefix
from rlpipe.core.errors import ConfigError, RunNotFoundError
from rlpipe.storage.eval_records import EvalInfo, task_key


@dataclass(frozen=True)
class ReplaySource:
    """What a replay starts from: the source eval, its task (loaded again), the steps to re-execute."""

    info: EvalInfo
    task: AgentTask
    prefix: ReplayPrefix
    recorded_steps: int  # steps of the source trial in all


def load_replay(store: TrialStore, trial_id: str, from_step: int) -> ReplaySource:
    parts = trial_id.split("/")
    if len(parts) != 3 or not parts[2].isdigit():
        raise ConfigError(f"trial id {trial_id!r} is not EVAL_ID/TASK/ATTEMPT",
                          hint="take it from `rlpipe query \"select trial_id, verdict, steps from eval_trials\"`")
    eval_id, key, attempt = parts[0], parts[1], int(parts[2])
    info = store.read_info(eval_id)
    if info is None:
        raise RunNotFoundError(f"the lake {store.uri} holds no eval {eval_id!r} (from trial {trial_id})",
                               hint="point --lake at the lake the trial was committed to")
    found = [c for c in store.commits(eval_id) if task_key(c.task_id) == key and c.attempt == attempt]
    if not found:
        raise RunNotFoundError(f"eval {eval_id!r} has no committed trial {trial_id!r}",
                               hint=f"query its trials: rlpipe query \"select trial_id from eval_trials where eval_id = '{eval_id}'\"")
    row, step_rows = store.read_trial(found[0])
    recorded = trial_from_rows(row, step_rows)
    tasks = {task.task_id: task for task in load_tasks(Path(info.tasks_dir) if info.tasks_dir else builtin_suite_dir())}
    task: AgentTask | SkippedTask | None = tasks.get(row.task_id)
    if not isinstance(task, AgentTask):
        raise ConfigError(f"task {row.task_id!r} of trial {trial_id} is not in {info.tasks_dir or 'the built-in suite'} any more"
                          + (f" ({task.reason})" if isinstance(task, SkippedTask) else ""),
                          hint="restore the task folder to replay the trial")
    steps = recorded.steps
    if not 0 <= from_step <= len(steps):
        raise ConfigError(f"--from-step {from_step} is outside trial {trial_id}, which has {len(steps)} steps",
                          hint=f"use 0 (the initial state) to {len(steps)}")
    submits = [step.index for step in steps[:from_step] if step.tool == "submit"]
    if submits:
        raise ConfigError(f"step {submits[0] + 1} of trial {trial_id} is its submit: the episode ended there",
                          hint=f"replay from step {submits[0]} or earlier")
    return ReplaySource(info, task, ReplayPrefix(trial_id, tuple(steps[:from_step])), len(steps))
