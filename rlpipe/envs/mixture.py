"""Domain registry and the task mixture.

What it does:
- `build_env(name, **params)` builds a registered domain from flat parameters (the caller
  may pass the whole `envs` config section: parameters a domain does not take are ignored).
  An unknown name raises ConfigError listing the known domains. Registered: arithmetic,
  arithmetic_chat(_equation), reverse, agent_tasks (multi-turn terminal tasks), code (HumanEval in a sandbox; it takes `timeout_s`, the sandbox's wall-clock
  limit). `register_env` adds a domain without editing this file's callers. Domains named
  in the `reasoning_gym` or `files` parameter (name -> that domain's keyword arguments, from
  envs.reasoning_gym.<name> / envs.files.<name>) are built as ReasoningGymEnv / FileTasksEnv.
- `Mixture(envs, ratios)` draws training tasks: each of `count` slots picks a domain with
  probability proportional to its ratio (seeded), then each domain contributes that many
  tasks from its train split. `heldout` gives a fixed per-domain evaluation set.
  `env_for(task)` finds the env that verifies a task.

What it does not: move ratios by pass rate (rl/curriculum.py computes a step's ratios;
`sample(..., ratios=...)` draws with them), or verify anything itself.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable

from rlpipe.core.errors import ConfigError
from rlpipe.core.records import Task
from rlpipe.envs.agent_tasks import AgentTasksEnv
from rlpipe.envs.arithmetic import ArithmeticEnv
from rlpipe.envs.arithmetic_chat import ArithmeticChatEnv, ArithmeticChatEquationEnv
from rlpipe.envs.base import Env
from rlpipe.envs.code import CodeEnv
from rlpipe.envs.file_tasks import FileTasksEnv
from rlpipe.envs.reasoning_gym_env import ReasoningGymEnv
from rlpipe.envs.reverse import ReverseEnv

_REGISTRY: dict[str, Callable[..., Env]] = {"arithmetic": ArithmeticEnv, "code": CodeEnv, "reverse": ReverseEnv}
_REGISTRY["arithmetic_chat"] = ArithmeticChatEnv  # instruct models, chat prompts (envs/arithmetic_chat.py)
_REGISTRY["arithmetic_chat_equation"] = ArithmeticChatEquationEnv
_REGISTRY["agent_tasks"] = AgentTasksEnv  # multi-turn terminal tasks (envs/agent_tasks.py, agents/episodes.py)


def register_env(name: str, factory: Callable[..., Env]) -> None:
    """Make `build_env(name, ...)` build domains with `factory` (keyword arguments only)."""
    _REGISTRY[name] = factory


def known_domains() -> list[str]:
    return sorted(_REGISTRY)


def build_env(name: str, **params: object) -> Env:
    """Build domain `name`, passing the parameters its factory accepts."""
    for table, factory_of_table in (("reasoning_gym", ReasoningGymEnv), ("files", FileTasksEnv)):
        specs = params.get(table) or {}
        if isinstance(specs, dict) and name in specs:
            try:
                return factory_of_table(name=name, **dict(specs[name]))
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"bad parameters for domain {name!r} (envs.{table}.{name}): {exc}",
                                  f"fix envs.{table}.{name} in the config; see docs/ENVIRONMENTS.md") from exc
    if name not in _REGISTRY:
        raise ConfigError(f"unknown domain {name!r} in envs.domains", f"known domains: {', '.join(known_domains())}; or define it under envs.reasoning_gym.{name} or envs.files.{name}")
    factory = _REGISTRY[name]
    accepted = inspect.signature(factory).parameters
    try:
        return factory(**{key: value for key, value in params.items() if key in accepted})
    except ValueError as exc:
        raise ConfigError(f"bad parameters for domain {name!r}: {exc}", "fix the envs.* values in the config") from exc


class Mixture:
    """Several domains sampled by ratio."""

    def __init__(self, envs: dict[str, Env], ratios: dict[str, float]) -> None:
        if not envs:
            raise ConfigError("a mixture needs at least one domain", "set envs.domains, e.g. {arithmetic = 1.0}")
        missing = sorted(set(ratios) - set(envs))
        if missing:
            raise ConfigError(f"ratios name domains that were not built: {missing}", f"built: {sorted(envs)}")
        if any(ratio < 0 for ratio in ratios.values()) or sum(ratios.get(name, 0.0) for name in envs) <= 0:
            raise ConfigError(f"domain ratios must be >= 0 and sum to > 0, got {ratios}", "e.g. {arithmetic = 0.7, reverse = 0.3}")
        self.envs = dict(envs)
        total = sum(ratios.get(name, 0.0) for name in envs)
        self.ratios = {name: ratios.get(name, 0.0) / total for name in envs}

    def with_ratios(self, ratios: dict[str, float]) -> Mixture:
        """The same envs with new ratios (for a curriculum)."""
        return Mixture(self.envs, ratios)

    def sample(self, count: int, rng_seed: int, ratios: dict[str, float] | None = None) -> list[Task]:
        """`count` training tasks; domains drawn by ratio (this mixture's, or `ratios`: a
        curriculum's for this step, over the same domains), tasks from each domain's train split."""
        rng = random.Random(rng_seed)
        weights = self.ratios if ratios is None else self.with_ratios(ratios).ratios
        names = list(self.ratios)
        draws = rng.choices(names, weights=[weights[name] for name in names], k=count)
        per_domain = {name: iter(self.envs[name].tasks("train", draws.count(name), seed=rng.randrange(2**31))) for name in names if name in draws}
        return [next(per_domain[name]) for name in draws]

    def heldout(self, count_per_domain: int, seed: int = 0) -> list[Task]:
        """A fixed evaluation set: `count_per_domain` held-out tasks of every domain with ratio > 0."""
        return [task for name, env in self.envs.items() if self.ratios[name] > 0 for task in env.tasks("heldout", count_per_domain, seed)]

    def env_for(self, task: Task) -> Env:
        """The env that produced (and verifies) `task`."""
        if task.domain not in self.envs:
            raise ConfigError(f"task {task.task_id!r} has domain {task.domain!r}, not in this mixture", f"domains: {sorted(self.envs)}")
        return self.envs[task.domain]
