"""Greedy evaluation on the controller's side: `greedy_accuracy` (pass@1 of the engine
worker's policy on a list of tasks, overall and per domain; code runs in the run's sandbox
pool, multi-turn tasks as whole episodes), the figure a warm-start check compares with its
target (`warmstart_accuracy`), the MLflow names of a held-out evaluation
(`heldout_metrics`) and the run's earlier evaluations a regression alert compares with
(`earlier_evaluations`).

Not here: when an evaluation runs and where its result is stored (tasks/lifecycle.py
`evaluate`, `warm_start`), the regression rule (rl/heldout_regression.py).
"""

from __future__ import annotations

from collections import defaultdict

from rlpipe.controller.agent_episodes import is_multi_turn, run_agent_episodes
from rlpipe.controller.runtime import Runtime
from rlpipe.controller.verify import verify_all
from rlpipe.core.records import Task
from rlpipe.engines.sampling import SamplingParams
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


def greedy_accuracy(runtime: Runtime, tasks: list[Task]) -> dict[str, float]:
    """Greedy pass@1 of the engine's policy on `tasks`: `accuracy` and `accuracy/<domain>`."""
    params = SamplingParams(
        n=1, temperature=1.0, top_p=1.0, max_new_tokens=runtime.config.rollout.max_new_tokens,
        stop=runtime.config.rollout.stop, seed=0, greedy=True,
    )
    episodic = [t for t in tasks if is_multi_turn(runtime.mixture.env_for(t))]
    single = [t for t in tasks if not is_multi_turn(runtime.mixture.env_for(t))]
    completions = runtime.workers.engine.generate([(t.task_id, t.prompt) for t in single], params).completions if single else []
    by_id = {t.task_id: t for t in tasks}
    passed: dict[str, list[float]] = defaultdict(list)
    pairs = [(by_id[completion.task_id], completion.text) for completion in completions]
    for (task_, _), verdict in zip(pairs, verify_all(runtime, pairs)):  # code runs in the run's sandbox pool
        passed[task_.domain].append(1.0 if verdict.passed else 0.0)
    for episode in run_agent_episodes(runtime, episodic, 1, params) if episodic else []:  # greedy whole episodes
        passed[by_id[episode.completion.task_id].domain].append(1.0 if episode.verdict.passed else 0.0)
    every = [value for values in passed.values() for value in values]
    result = {"accuracy": sum(every) / len(every)}
    result.update({f"accuracy/{domain}": sum(v) / len(v) for domain, v in sorted(passed.items())})
    return result


def heldout_metrics(result: dict[str, float]) -> dict[str, float]:
    """MLflow names of an evaluation: `heldout/accuracy` overall, `heldout/<domain>/accuracy`."""
    return {f"heldout/{key.removeprefix('accuracy/')}/accuracy" if key.startswith("accuracy/") else f"heldout/{key}": value
            for key, value in result.items()}


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
