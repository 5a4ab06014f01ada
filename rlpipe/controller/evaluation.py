"""Greedy evaluation on the controller's side: `greedy_accuracy` (pass@1 of the engine
worker's policy on a list of tasks, overall and per domain, strict and format-free: see
its docstring; code runs in the run's sandbox pool, multi-turn tasks as whole episodes),
`family_figures` (the per-family and per-task outcomes of the domains whose env splits its
tasks into families, e.g. agent_tasks), `heldout_tasks` (the run's held-out set, drawn with envs.heldout_seed, not the run's
seed, so that every seed of a recipe is evaluated on the same problems), the figure a warm-start check compares with its
target (`warmstart_accuracy`), the MLflow names of a held-out evaluation
(`heldout_metrics`) and the run's earlier evaluations a regression alert compares with
(`earlier_evaluations`).

Not here: when an evaluation runs and where its result is stored (tasks/lifecycle.py
`evaluate`, `warm_start`), the regression rule (rl/heldout_regression.py).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from rlpipe.controller.agent_episodes import is_multi_turn, run_agent_episodes
from rlpipe.controller.runtime import Runtime
from rlpipe.controller.verify import verify_all
from rlpipe.core.config import RunConfig
from rlpipe.core.records import Task
from rlpipe.engines.sampling import SamplingParams
from rlpipe.envs.format_free import format_free_passed
from rlpipe.envs.mixture import Mixture
from rlpipe.rl.heldout_regression import Evaluation


def warmstart_accuracy(result: dict[str, float], scope: str) -> float:
    """The figure a warm-start check compares with warmstart.target_accuracy, from
    `greedy_accuracy`'s result: the overall accuracy, or (scope every_domain) the lowest
    domain's, so that the warm-start stops only once every domain has reached the target."""
    if scope == "overall":
        return result["accuracy"]
    if scope == "every_domain":
        return min(value for key, value in result.items() if key.startswith("accuracy/"))
    raise ValueError(f"unknown warmstart.target_scope {scope!r}; use overall or every_domain")


def heldout_tasks(config: RunConfig, mixture: Mixture) -> list[Task]:
    """The run's held-out set: envs.heldout_size tasks of every domain, drawn with
    envs.heldout_seed (a function of the task source and that seed only: two runs of one
    recipe with different `seed`s are scored on the same problems)."""
    return mixture.heldout(config.envs.heldout_size, seed=config.envs.heldout_seed)


def greedy_accuracy(runtime: Runtime, tasks: list[Task]) -> dict[str, float]:
    """Greedy pass@1 of the engine's policy on `tasks` (one batched request to the engine
    worker for the single-turn tasks, in eval.engine_dtype at eval.batch_size where set: see
    `evaluation_options`), as flat figures:

    - `accuracy`, `accuracy/<domain>`: strict, the domain's own verifier on the whole reply;
    - `format_free`, `format_free/<domain>`: the reply's last number equals the task's
      numeric answer (envs/format_free.py), for the domains whose answers are numbers
      (absent for the others; `format_free` over those domains only);
    - `n/<domain>`: the tasks scored, the n of each accuracy's binomial standard error;
    - `wellformed/<domain>`, `replies/<domain>` (multi-turn domains): the share of the
      episodes' replies that parsed as a tool call (agents/tools.py), over that many replies;
    - for the multi-turn tasks whose env names their family (`task_family(task)`, e.g.
      agent_tasks): each family's figures and each task's outcome (`family_figures`), so
      that two evaluations of one held-out set can be compared family by family and task
      by task."""
    params = SamplingParams(
        n=1, temperature=1.0, top_p=1.0, max_new_tokens=runtime.config.rollout.max_new_tokens,
        stop=runtime.config.rollout.stop, seed=0, greedy=True,
    )
    episodic = [t for t in tasks if is_multi_turn(runtime.mixture.env_for(t))]
    single = [t for t in tasks if not is_multi_turn(runtime.mixture.env_for(t))]
    options = evaluation_options(runtime.config)
    completions = (runtime.workers.engine.generate([(t.task_id, t.prompt) for t in single], params, **options).completions
                   if single else [])
    by_id = {t.task_id: t for t in tasks}
    passed: dict[str, list[float]] = defaultdict(list)
    free: dict[str, list[float]] = defaultdict(list)
    pairs = [(by_id[completion.task_id], completion.text) for completion in completions]
    for (task_, text), verdict in zip(pairs, verify_all(runtime, pairs)):  # code runs in the run's sandbox pool
        passed[task_.domain].append(1.0 if verdict.passed else 0.0)
        _add_format_free(free, task_, text)
    calls: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # per multi-turn domain: replies, well-formed ones
    outcomes: list[EpisodeOutcome] = []  # of the tasks whose env names their family
    for episode in run_agent_episodes(runtime, episodic, 1, params, options) if episodic else []:  # greedy whole episodes
        task_ = by_id[episode.completion.task_id]
        domain = task_.domain
        passed[domain].append(1.0 if episode.verdict.passed else 0.0)
        calls[domain][0] += episode.turns
        calls[domain][1] += episode.turns - episode.malformed_calls
        family_of = getattr(runtime.mixture.env_for(task_), "task_family", None)
        if family_of is not None:
            outcomes.append(EpisodeOutcome(domain, family_of(task_), task_.task_id, episode.verdict.passed,
                                           episode.turns, episode.turns - episode.malformed_calls))
    figures = accuracy_figures(passed, free)
    figures.update({f"wellformed/{domain}": formed / replies for domain, (replies, formed) in sorted(calls.items()) if replies})
    figures.update({f"replies/{domain}": float(replies) for domain, (replies, _) in sorted(calls.items())})
    figures.update(family_figures(outcomes))
    return figures


@dataclass(frozen=True)
class EpisodeOutcome:
    """One greedy episode of an evaluation, of a task whose env names its family."""

    domain: str
    family: str
    task_id: str
    passed: bool
    replies: int
    well_formed: int  # replies that parsed as a tool call


def family_figures(outcomes: list[EpisodeOutcome]) -> dict[str, float]:
    """Per family of a domain: `family/<domain>/<family>` (the share of its episodes that
    passed), `n/<domain>/<family>` (its episodes), `wellformed/<domain>/<family>` and
    `replies/<domain>/<family>` (as greedy_accuracy's per domain); per task:
    `task/<task_id>` (1.0 passed, 0.0 not; the mean where a task was played more than once).
    Keys none of the per-domain readers take (they read `accuracy/<domain>` and `n/<domain>`)."""
    groups: dict[tuple[str, str], list[EpisodeOutcome]] = defaultdict(list)
    tasks: dict[str, list[float]] = defaultdict(list)
    for outcome in outcomes:
        groups[(outcome.domain, outcome.family)].append(outcome)
        tasks[outcome.task_id].append(1.0 if outcome.passed else 0.0)
    figures: dict[str, float] = {}
    for (domain, family), group in sorted(groups.items()):
        name = f"{domain}/{family}"
        replies = sum(o.replies for o in group)
        figures[f"family/{name}"] = sum(o.passed for o in group) / len(group)
        figures[f"n/{name}"] = float(len(group))
        figures[f"replies/{name}"] = float(replies)
        if replies:
            figures[f"wellformed/{name}"] = sum(o.well_formed for o in group) / replies
    figures.update({f"task/{task_id}": sum(values) / len(values) for task_id, values in sorted(tasks.items())})
    return figures


def evaluation_options(config: RunConfig) -> dict[str, Any]:
    """The engine worker's Generate options of a greedy evaluation: eval.engine_dtype as
    `dtype` and eval.batch_size as `batch_size`, each only where set (else the engine's own)."""
    settings = config.eval
    return {key: value for key, value in (("dtype", settings.engine_dtype), ("batch_size", settings.batch_size))
            if value is not None}


def _add_format_free(free: dict[str, list[float]], task: Task, text: str) -> None:
    verdict = format_free_passed(task, text)
    if verdict is not None:
        free[task.domain].append(1.0 if verdict else 0.0)


def accuracy_figures(passed: dict[str, list[float]], free: dict[str, list[float]]) -> dict[str, float]:
    """greedy_accuracy's figures from the per-domain 0/1 outcomes (strict, format-free)."""
    every = [value for values in passed.values() for value in values]
    result = {"accuracy": sum(every) / len(every)}
    result.update({f"accuracy/{domain}": sum(v) / len(v) for domain, v in sorted(passed.items())})
    every_free = [value for domain, values in free.items() if values for value in values]
    if every_free:
        result["format_free"] = sum(every_free) / len(every_free)
    result.update({f"format_free/{domain}": sum(v) / len(v) for domain, v in sorted(free.items()) if v})
    result.update({f"n/{domain}": float(len(v)) for domain, v in sorted(passed.items())})
    return result


def heldout_metrics(result: dict[str, float]) -> dict[str, float]:
    """MLflow names of an evaluation (curves over the step): `heldout/accuracy` and
    `heldout/format_free` overall, `heldout/<domain>/accuracy` and
    `heldout/<domain>/format_free`, a family's as `heldout/<domain>/<family>/accuracy` (the
    counts `n/...`, `replies/...` and the per-task outcomes `task/...` are not logged)."""
    metrics = {}
    for key, value in result.items():
        kind, _, domain = key.partition("/")
        if kind in ("n", "replies", "task"):
            continue
        if kind == "family":
            kind = "accuracy"
        metrics[f"heldout/{domain}/{kind}" if domain else f"heldout/{key}"] = value
    return metrics


def earlier_evaluations(runtime: Runtime, current: Evaluation) -> list[Evaluation]:
    """The run's stored evaluations before `current` (before_rl, then step_N every
    eval.every_steps), oldest first: the regression alert compares with them."""
    every = runtime.config.eval.every_steps
    steps = range(every, current.policy_version, every) if every else range(0)  # every_steps 0: no evaluation mid-run
    names = ["before_rl", *(f"step_{step:06d}" for step in steps)]
    lake = runtime.records.lake
    stored = ((name, lake.read_json(runtime.run_id, f"evals/{name}.json")) for name in names if name != current.name)
    return [Evaluation.from_result(name, int(doc["policy_version"]), {k: v for k, v in doc.items() if k != "policy_version"})
            for name, doc in stored if doc is not None and int(doc["policy_version"]) < current.policy_version]
