"""What a step draws: the mixture of domains (`build_mixture`), the curriculum's domain
ratios of a step (`step_ratios`), the tasks of a step's first round (`step_tasks`) and of
a dynamic-sampling round (`round_tasks`, `extra_round_count`). Every draw is a function of
(run seed, step, round) and, with the curriculum on, of committed steps only, so a resumed
run draws what the killed one drew.

Not here: generating from the tasks (controller/generate.py), selecting groups (rl/dynamic_sampling.py).
"""

from __future__ import annotations

from rlpipe.controller.runtime import Runtime
from rlpipe.core.config import RunConfig
from rlpipe.core.errors import ConfigError
from rlpipe.core.records import Task
from rlpipe.core.seeds import derive_seed
from rlpipe.envs.mixture import Mixture, build_env
from rlpipe.rl.curriculum import Curriculum, CurriculumSettings, MissingStep, domain_rates
from rlpipe.rl.dynamic_sampling import extra_round_size


def build_mixture(config: RunConfig) -> Mixture:
    envs_config = config.envs
    envs = {
        name: build_env(name, max_operand=envs_config.max_operand, max_word_len=envs_config.max_word_len,
                        agent_families=envs_config.agent_families,
                        timeout_s=config.sandbox.timeout_s, **envs_config.domain_tables())
        for name in envs_config.domains
    }
    return Mixture(envs, dict(envs_config.domains))


def step_ratios(runtime: Runtime, step: int) -> dict[str, float] | None:
    """The curriculum's domain ratios of RL step `step`, None when [curriculum] is off. A
    function of the config and the committed steps <= step - 1 - rollout.max_staleness
    (rl/curriculum.py), so a resumed run draws with the ratios the killed one drew with."""
    progress = runtime.progress
    config = runtime.config
    if not config.curriculum.enabled:
        return None
    if progress.curriculum is None:
        low, high = config.curriculum.band
        settings = CurriculumSettings(low=low, high=high, rate=config.curriculum.rate, min_ratio=config.curriculum.min_ratio,
                                      window=config.curriculum.window, delay=config.rollout.max_staleness)

        def rates_of_step(committed: int) -> dict[str, float] | None:
            manifest = runtime.records.lake.read_manifest(runtime.run_id, committed)
            return None if manifest is None else domain_rates(dict(manifest.metrics))

        progress.curriculum = Curriculum(dict(config.envs.domains), settings, rates_of_step)
    try:
        return progress.curriculum.ratios(step)
    except MissingStep as exc:
        raise RuntimeError(f"step {step} of run {runtime.run_id}: {exc}; a step's tasks are drawn only once "
                           f"the steps up to {step - 1 - progress.curriculum.settings.delay} are committed") from None


def step_tasks(runtime: Runtime, step: int) -> list[Task]:
    """The tasks of RL step `step`: a function of (run seed, step) and, with the curriculum
    on, of the committed steps its ratios come from (`step_ratios`)."""
    count = runtime.config.rollout.prompts_per_step
    tasks = runtime.mixture.sample(count, rng_seed=derive_seed(runtime.config.seed, step, "sample"),
                                   ratios=step_ratios(runtime, step))
    if len({task.task_id for task in tasks}) != len(tasks):
        raise ConfigError(
            f"step {step} drew the same task twice: rollout.prompts_per_step={count} is larger than a domain's training split",
            "lower rollout.prompts_per_step or widen the domain (e.g. envs.max_operand; a GRPO group is one task's samples)",
        )
    return tasks


def round_tasks(runtime: Runtime, step: int, round_: int, count: int, exclude: tuple[str, ...]) -> list[Task]:
    """The tasks of one generation round of `step`: a function of (run seed, step, round,
    count, exclude) and the curriculum's ratios of the step."""
    if round_ == 0:
        return step_tasks(runtime, step)
    excluded = set(exclude)
    drawn = runtime.mixture.sample(count + len(excluded), rng_seed=derive_seed(runtime.config.seed, step, f"sample-round-{round_}"),
                                   ratios=step_ratios(runtime, step))
    fresh: dict[str, Task] = {}
    for task_ in drawn:
        if task_.task_id not in excluded and task_.task_id not in fresh:
            fresh[task_.task_id] = task_
    return list(fresh.values())[:count]


def extra_round_count(wanted: int, with_signal: int, generated: int) -> int:
    """Dynamic sampling: how many tasks the next round draws (rl/dynamic_sampling.py)."""
    return extra_round_size(wanted - with_signal, with_signal, generated, cap=wanted)
