"""Multi-turn domains inside `rlpipe train`: their episodes through the run's engine worker
and sandbox pool (agents/episodes.py), for the generate stage, the held-out evaluation and
the warm-start's oracle trajectories.

- `is_multi_turn(env)`: the env runs episodes (envs/agent_tasks.py sets `multi_turn`).
- `run_agent_episodes(runtime, tasks, params)`: group episodes of every task; each result
  carries its completion (the whole episode, loss-masked) and the verifier's verdict, so the
  verify stage keeps these rows as they are (controller/verify.py).
- `oracle_examples(runtime, tasks)`: the env's oracle replies played as real episodes in
  the pool (the observations are what the tools returned); every episode becomes ONE
  example for the supervised warm-start: (prompt, ((reply + stop, True), (observation,
  False), ...)), the loss on the replies only, the same masking as the RL loss. One
  sequence trains every reply given the context before it, as one (context, reply) pair per
  reply would, at a third of the tokens for a 3-reply episode, and a batch of N examples
  holds N of each reply (with pairs, a third of a batch was each kind). TRAIN tasks only:
  the caller draws them from the mixture's train split. An oracle episode that fails its
  verifier is an env bug and raises.

- `gate_verify(env, task, text, sandbox)`: the quality gate's verify (rlpipe qa, qa.before_train):
  for a multi-turn env the answer is a SCRIPTED EPISODE (a JSON list of replies, as the
  env's reference answer and its qa probes are; any other text is one reply), played in
  `sandbox` from the task's initial files, then judged by the env's verifier on the final
  state; for any other env qa/gate.py's `guarded_verify`. A crash is an unscored verdict.

Not here: the episode loop (agents/episodes.py), the tasks (envs/), the stages (rollout.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlpipe.agents.episodes import ChatEpisodeFormat, EpisodeResult, EpisodeSettings, run_episodes
from rlpipe.controller.runtime import Runtime
from rlpipe.core.errors import ConfigError
from rlpipe.core.records import Completion, Segments, Task, Verdict, VerdictReason
from rlpipe.engines.sampling import SamplingParams
from rlpipe.qa.gate import guarded_verify


def is_multi_turn(env: object) -> bool:
    return bool(getattr(env, "multi_turn", False))


def episode_settings(runtime: Runtime) -> EpisodeSettings:
    """The episode limits of this run: the model's context, its EOS id; with
    envs.agent_chat_template the chat format cut from the engine's own template (the EOS
    then ends a turn, not the episode)."""
    config = runtime.config
    if config.model.prompt_format != "plain":
        raise ConfigError("multi-turn domains (agent_tasks) need model.prompt_format = \"plain\"",
                          "the episode runner renders each context itself; for a chat model set "
                          "model.prompt_format=plain and envs.agent_chat_template=true")
    settings = _model_settings(runtime)
    if not config.envs.agent_chat_template:
        return settings
    return dataclasses.replace(settings, eos_token_id=None, chat=chat_format(runtime))


def chat_format(runtime: Runtime) -> ChatEpisodeFormat:
    """The episode's chat format, cut from conversations the engine worker's tokenizer renders
    (three small requests, made for every batch of episodes)."""
    stop = runtime.config.rollout.stop
    if not stop:
        raise ConfigError("envs.agent_chat_template needs rollout.stop = [the template's end of turn]",
                          "for SmolLM2: rollout.stop = [\"<|im_end|>\"]")
    try:
        return ChatEpisodeFormat.from_template(lambda messages: runtime.workers.engine.render_chat(messages).text, stop[0])
    except ValueError as exc:
        raise ConfigError(f"envs.agent_chat_template: {exc}", "use a chat model whose template renders turns one after "
                          "another (ChatML: SmolLM2, Qwen2)") from exc


def _model_settings(runtime: Runtime) -> EpisodeSettings:
    config = runtime.config
    if config.model.path is None and config.model.gguf is None:
        from rlpipe.rl.char_tokenizer import EOS_TOKEN, char_tokenizer_backend, policy_alphabet

        eos_token_id = char_tokenizer_backend(policy_alphabet(config.envs.domains)).token_to_id(EOS_TOKEN)
        return EpisodeSettings(max_context_tokens=config.model.max_position_embeddings, eos_token_id=eos_token_id)
    model_config: dict = {}
    if config.model.path is not None:  # an HF folder (e.g. a checkpoint's policy/): its own context and EOS
        try:
            model_config = json.loads((Path(config.model.path) / "config.json").read_text())
        except (OSError, ValueError):
            model_config = {}
    eos = model_config.get("eos_token_id")
    return EpisodeSettings(max_context_tokens=int(model_config.get("max_position_embeddings") or 2048),
                           eos_token_id=eos if isinstance(eos, int) else None)


def run_agent_episodes(runtime: Runtime, tasks: list[Task], group_size: int, params: SamplingParams,
                       engine_options: dict[str, Any] | None = None) -> list[EpisodeResult]:
    """`group_size` episodes of each task through the engine worker, in the run's pool;
    `engine_options`: the Generate options of every turn (an evaluation's dtype, batch size)."""
    workers = runtime.workers
    if workers.sandbox_pool is None:
        raise RuntimeError("a multi-turn domain needs the run's sandbox pool (build_sandbox_pool)")

    def generate(prompts: list[tuple[str, str]], sampling: SamplingParams) -> tuple[list[Completion], int]:
        result = workers.engine.generate(prompts, sampling, **(engine_options or {}))
        return result.completions, result.policy_version

    return run_episodes(tasks, group_size, params, generate, workers.sandbox_pool, runtime.mixture.env_for,
                        episode_settings(runtime))


def oracle_examples(runtime: Runtime, tasks: list[Task]) -> list[tuple[str, Segments]]:
    """One (prompt, segments) example per oracle episode of a task (see the module docstring)."""
    workers = runtime.workers
    if workers.sandbox_pool is None:
        raise RuntimeError("a multi-turn domain needs the run's sandbox pool (build_sandbox_pool)")
    unique = list({task.task_id: task for task in tasks}.values())
    stop = runtime.config.rollout.stop[0] if runtime.config.rollout.stop else "\n"
    oracle = OracleEngine({task.task_id: runtime.mixture.env_for(task).oracle_turns(task) for task in unique}, stop)
    params = SamplingParams(n=1, max_new_tokens=runtime.config.rollout.max_new_tokens, stop=(stop,), seed=0, greedy=True)
    results = run_episodes(unique, 1, params, oracle.generate, workers.sandbox_pool, runtime.mixture.env_for,
                           episode_settings(runtime))
    failed = [(result.completion.task_id, result.verdict.detail) for result in results if not result.verdict.passed]
    if failed:
        raise RuntimeError(f"{len(failed)} oracle episodes failed their verifier (an env bug); the first: {failed[0]}")
    return oracle.episodes


class OracleEngine:
    """A scripted engine that replies each episode's oracle turns in order (a test-free use of
    the Generate protocol): token ids are character codes, so contexts extend exactly.
    `episodes`: what it replied, per episode, as warm-start examples (prompt, segments)."""

    def __init__(self, turns: dict[str, list[str]], stop: str) -> None:
        self.turns, self.stop = turns, stop
        self.replied: dict[str, int] = defaultdict(int)
        self._prompts: dict[str, str] = {}
        self._segments: dict[str, list[tuple[str, bool]]] = defaultdict(list)

    def generate(self, prompts: list[tuple[str, str]], params: SamplingParams) -> tuple[list[Completion], int]:
        completions = []
        for key, context in prompts:
            task_id, _, sample = key.rpartition("#")
            index = self.replied[key]
            self.replied[key] += 1
            replies = self.turns[task_id]
            reply = replies[index] if index < len(replies) else replies[-1]
            self._record(key, context, reply + self.stop)
            tokens = tuple(ord(char) for char in reply + self.stop)
            completions.append(Completion(key, int(sample), reply, tuple(ord(char) for char in context), tokens,
                                          (0.0,) * len(tokens), "stop", 0))
        return completions, 0

    def _record(self, key: str, context: str, reply: str) -> None:
        if key not in self._prompts:
            self._prompts[key] = context
        else:  # the episode so far: its prompt, then every reply and tool output recorded
            before = self._prompts[key] + "".join(text for text, _ in self._segments[key])
            if not context.startswith(before):
                raise RuntimeError(f"episode {key}: the context of a turn does not extend the one before it")
            self._segments[key].append((context[len(before):], False))  # the tool's output
        self._segments[key].append((reply, True))

    @property
    def episodes(self) -> list[tuple[str, Segments]]:
        return [(prompt, tuple(self._segments[key])) for key, prompt in self._prompts.items()]


# A scripted episode's limits: the env's max_turns bounds it; its context never does.
_SCRIPT_SETTINGS = EpisodeSettings(max_context_tokens=10**9)
_SCRIPT_PARAMS = SamplingParams(n=1, max_new_tokens=1, stop=("\n",), seed=0, greedy=True)


def gate_verify(env: object, task: Task, text: str, sandbox: object = None) -> Verdict:
    """The quality gate's verdict on one answer (see the module docstring)."""
    if not is_multi_turn(env):
        return guarded_verify(env, task, text, sandbox)
    started = time.perf_counter()
    try:
        replies = json.loads(text)
        if not (isinstance(replies, list) and replies and all(isinstance(reply, str) for reply in replies)):
            replies = [text]
    except ValueError:
        replies = [text]
    try:
        engine = OracleEngine({task.task_id: replies}, _SCRIPT_PARAMS.stop[0])
        (result,) = run_episodes([task], 1, _SCRIPT_PARAMS, engine.generate, _OneSandbox(sandbox), lambda _: env,
                                 _SCRIPT_SETTINGS)
        return result.verdict
    except Exception as exc:  # noqa: BLE001 - an episode or a verifier that raises is a finding, not a crash
        return Verdict(reward=None, passed=False, reason=VerdictReason.CRASH,
                       detail=f"the scripted episode raised {type(exc).__name__}: {str(exc)[:150]}",
                       duration_s=time.perf_counter() - started, verifier_version=getattr(env, "verifier_version", ""))


class _OneSandbox:
    """One sandbox (the gate's pool lends it per answer) as the pool run_episodes takes."""

    size = 1

    def __init__(self, sandbox: object) -> None:
        if sandbox is None:
            raise RuntimeError("a multi-turn env's answers are episodes: the gate must lend a sandbox")
        self._sandbox = sandbox

    @contextlib.contextmanager
    def acquire(self) -> Iterator[object]:
        yield self._sandbox
