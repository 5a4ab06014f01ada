"""An eval: every task of a suite attempted once by one agent, in parallel trials, and its metrics.

Metrics (EvalReport.metrics, what `rlpipe eval --json` prints):

    success_rate          passed / scored, where scored = trials with an agent verdict
                          (infrastructure failures and tasks not run are left out, and
                          counted apart); 0.0 when nothing was scored
    trials, scored, passed, infrastructure_failures, not_run
    verdicts              {verdict: count} for every verdict that occurred
    steps_mean            mean number of agent replies per scored trial
    tool_calls, malformed_calls, well_formed_rate (well-formed / all replies), tool_errors
    duration_s_mean       mean wall-clock seconds of a scored trial

What it does not do: retry infrastructure failures, resume, or store anything (the CLI
and, later, the rl-eval flow do that).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rlpipe.agents.agents import AGENTS, AgentFactory
from rlpipe.agents.records import TrialResult, TrialVerdict
from rlpipe.agents.task_format import AgentTask, SkippedTask
from rlpipe.agents.trial import TrialOptions, run_trial
from rlpipe.core.errors import ConfigError


@dataclass(frozen=True)
class EvalReport:
    agent: str
    backend: str
    trials: tuple[TrialResult, ...]
    metrics: dict[str, object]


def agent_factory(name: str) -> AgentFactory:
    try:
        return AGENTS[name]
    except KeyError:
        raise ConfigError(f"unknown agent {name!r}", hint=f"use one of {', '.join(sorted(AGENTS))}") from None


def run_eval(tasks: Sequence[AgentTask | SkippedTask], agent: str, backend: str, workers: int = 2,
             options: TrialOptions = TrialOptions()) -> EvalReport:
    """One trial per task, `workers` at a time; results in the order of `tasks`."""
    factory = agent_factory(agent)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        trials = tuple(pool.map(lambda task: run_trial(task, agent, factory, backend, options), tasks))
    return EvalReport(agent, backend, trials, eval_metrics(trials))


def eval_metrics(trials: Sequence[TrialResult]) -> dict[str, object]:
    scored = [trial for trial in trials if trial.verdict.family == "agent"]
    passed = sum(trial.passed for trial in scored)
    replies = [step for trial in scored for step in trial.steps]
    malformed = sum(step.tool is None for step in replies)
    counts = Counter(trial.verdict.value for trial in trials)
    return {
        "success_rate": passed / len(scored) if scored else 0.0,
        "trials": len(trials),
        "scored": len(scored),
        "passed": passed,
        "infrastructure_failures": sum(trial.verdict.family == "infrastructure" for trial in trials),
        "not_run": sum(trial.verdict.family == "not_run" for trial in trials),
        "verdicts": {verdict.value: counts[verdict.value] for verdict in TrialVerdict if counts[verdict.value]},
        "steps_mean": sum(len(trial.steps) for trial in scored) / len(scored) if scored else 0.0,
        "tool_calls": len(replies) - malformed,
        "malformed_calls": malformed,
        "well_formed_rate": (len(replies) - malformed) / len(replies) if replies else 1.0,
        "tool_errors": sum(step.tool_error for step in replies),
        "duration_s_mean": sum(trial.duration_s for trial in scored) / len(scored) if scored else 0.0,
    }
