"""Stage `generate` (stage 2 of a step, tasks/step_tasks.py): group_size completions
per task by the engine worker, sampled by the policy version the step needs
(rl/staleness.py); the engine is brought to that version first (controller/weight_sync.py).
Tasks of a multi-turn domain (agent_tasks) are run as whole episodes in the sandbox pool
(controller/agent_episodes.py): one row per episode, its verdict already the verifier's.

Not here: drawing the tasks (controller/sample.py), staging the rows (tasks/step_tasks.py),
the engine itself (workers/engine_worker.py, engines/).
"""

from __future__ import annotations

from rlpipe.controller.agent_episodes import is_multi_turn, run_agent_episodes
from rlpipe.controller.runtime import Runtime
from rlpipe.controller.weight_sync import ensure_engine_version
from rlpipe.core.failpoints import failpoint
from rlpipe.core.records import Completion, Task, Trajectory
from rlpipe.core.seeds import derive_seed
from rlpipe.engines.sampling import SamplingParams
from rlpipe.rl.staleness import generation_version


def generate(runtime: Runtime, step: int, tasks: list[Task], round_: int = 0) -> list[Trajectory]:
    """group_size completions per task, by the policy version the step needs."""
    rollout_settings = runtime.config.rollout
    params = SamplingParams(
        n=rollout_settings.group_size,
        temperature=rollout_settings.temperature,
        top_p=rollout_settings.top_p,
        max_new_tokens=rollout_settings.max_new_tokens,
        stop=rollout_settings.stop,
        seed=derive_seed(runtime.config.seed, step, "generate" if round_ == 0 else f"generate-round-{round_}"),
    )
    version = generation_version(step, rollout_settings.max_staleness)
    ensure_engine_version(runtime, version)
    episodic = [t for t in tasks if is_multi_turn(runtime.mixture.env_for(t))]
    single = [t for t in tasks if not is_multi_turn(runtime.mixture.env_for(t))]
    completions: list[Completion] = []
    if single:
        result = runtime.workers.engine.generate([(t.task_id, t.prompt) for t in single], params)
        completions = list(result.completions)
    # multi-turn domains: whole episodes in the sandbox pool, judged by their verifier at the end
    episodes = run_agent_episodes(runtime, episodic, rollout_settings.group_size, params) if episodic else []
    completions += [episode.completion for episode in episodes]
    verdicts = {(e.completion.task_id, e.completion.sample_idx): e.verdict for e in episodes}
    wrong = sorted({completion.policy_version for completion in completions} - {version})
    if wrong:
        raise ValueError(f"step {step}: the engine sampled with policy version {wrong[0]}, the step needs version {version}")
    failpoint("generate")
    by_id = {t.task_id: t for t in tasks}
    return [
        Trajectory(runtime.run_id, step, completion.policy_version, by_id[completion.task_id], completion,
                   verdict=verdicts.get((completion.task_id, completion.sample_idx)))
        for completion in completions
    ]
