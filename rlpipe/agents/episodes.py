"""Multi-turn episodes for RL: a batch of tasks x group episodes, run in lockstep turns, each
in its own sandbox of the pool, stored as ONE completion whose tokens are the whole episode.

    for every episode: a sandbox from the pool, the task's initial files in /work
    turn t: every live episode's context (prompt + its turns and tool outputs so far) goes
            to the engine in ONE generate call, a row per episode; a reply ends at the stop
            string (a newline: one tool call per line)
            -> parse the tool call (agents/tools.py) -> run it in the episode's sandbox (all
            live episodes' calls at once, on a thread pool) -> the observation
    an episode ends on `submit`, after max_turns replies (the last one's call still runs), at
    EOS, when its next context would leave no room for a whole reply in max_context_tokens, or when the engine's tokens of its next context do not extend
    what it sampled (a tokenizer that re-tokenizes across the turn boundary)
    then the env's verifier judges the final /work in the same sandbox: the reward.
    Before the first reply the prompt's characters stand for its tokens (there are at least as
    many); an episode whose prompt leaves no room ends then ("context"), recorded with no
    tokens; when no episode of the call gets a first reply, ValueError names the setting.

The completion of an episode: `prompt_token_ids` are the task prompt's, `token_ids` every
token after it (replies and observations, in order), `logprobs` the behaviour logprobs of the
replies' tokens (0.0 on observations), `loss_mask` 1 on reply tokens and 0 on observation
tokens, `text` the whole episode text after the prompt, `finish_reason` "stop" when the
agent submitted (or ended at EOS) and "length" when a limit ended it. The observation tokens
are the ones the engine itself fed (the suffix of its next context's prompt ids), so the
trainer scores exactly the sequence the policy was sampled on.

Observation format (short, for tiny models): `out: <stdout+stderr, cut>` plus ` [exit N]`
when a command fails; `out: ok` after write_file; `error: <kind>` after a malformed call.

Chat episodes (`settings.chat`, a ChatEpisodeFormat built from the model's chat template):
the prompt is the system prompt and the task as the user's message with the assistant turn
opened; every reply is closed with the template's end of turn (the stop string, which the
model learns to emit: SmolLM2's <|im_end|>, its EOS, so EOS ends a TURN here, not the
episode); every observation is a user message headed "Tool result:" (the policy agent's
layout, agents/policy.py), the assistant turn reopened after it. The text is exactly what
the template renders for that conversation (checked when the format is built).

What it does not: choose tasks or seeds, compute advantages, or store rows (tasks/step_tasks.py);
the engine is any `generate(prompts, params) -> (completions, policy_version)` callable and
the pool anything with `acquire()` (sandbox/pool.py), so tests pass their own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field

from rlpipe.agents.policy import TOOL_RESULT_HEADER
from rlpipe.agents.tools import CHAT_SYSTEM_PROMPT, MalformedCall, ToolCall, parse_tool_call
from rlpipe.core.records import Completion, Task, Verdict
from rlpipe.engines.sampling import SamplingParams
from rlpipe.sandbox.base import Sandbox

Generate = Callable[[list[tuple[str, str]], SamplingParams], tuple[list[Completion], int]]
"""(episode id, context text) pairs and params -> (completions with task_id = episode id,
the policy version that sampled them)."""


_USER, _REPLY, _TOOL = "@@user@@", "@@reply@@", "@@tool@@"


@dataclass(frozen=True)
class ChatEpisodeFormat:
    """The pieces of a chat template around an episode's texts (see the module docstring)."""

    before_task: str  # the system turn and the user's turn opened
    after_task: str  # the user's turn closed, the assistant's opened
    turn_end: str  # closes a reply: the stop string
    tool_open: str  # after turn_end, before an observation (the "Tool result:" header included)
    tool_close: str  # after the observation: the assistant's turn reopened

    def prompt(self, task_prompt: str) -> str:
        return self.before_task + task_prompt.strip() + self.after_task

    def observation(self, text: str) -> str:
        return self.tool_open + text.rstrip("\n") + self.tool_close

    @classmethod
    def from_template(cls, render: Callable[[tuple[tuple[str, str], ...]], str], turn_end: str,
                      system: str = CHAT_SYSTEM_PROMPT) -> ChatEpisodeFormat:
        """Cut the pieces out of conversations rendered by `render` ((role, content) pairs ->
        the template's text, the assistant turn opened), then check that a two-round
        conversation renders to exactly the pieces joined; ValueError when the template is not
        linear that way or does not close a reply with `turn_end`."""
        head = render((("system", system), ("user", _USER)))
        before, sep, after = head.partition(_USER)
        one = render((("system", system), ("user", _USER), ("assistant", _REPLY), ("user", TOOL_RESULT_HEADER + _TOOL)))
        if not sep or not one.startswith(head + _REPLY) or _TOOL not in one:
            raise ValueError("the chat template does not render a conversation as its head followed by the turns")
        between, _, tool_close = one[len(head + _REPLY):].partition(_TOOL)
        if not turn_end or not between.startswith(turn_end):
            raise ValueError(f"the chat template closes an assistant turn with {between[:20]!r}, not the stop string "
                             f"{turn_end!r}; set rollout.stop to the template's end of turn")
        chat = cls(before, after, turn_end, between[len(turn_end):], tool_close)
        two = render((("system", system), ("user", "t"), ("assistant", "r1"), ("user", TOOL_RESULT_HEADER + "o1"),
                      ("assistant", "r2"), ("user", TOOL_RESULT_HEADER + "o2")))
        joined = chat.prompt("t") + "r1" + turn_end + chat.observation("o1") + "r2" + turn_end + chat.observation("o2")
        if two != joined:
            raise ValueError("the chat template renders a two-round episode differently from its pieces joined")
        return chat


@dataclass(frozen=True)
class EpisodeSettings:
    """Limits of an episode beyond the env's max_turns."""

    max_context_tokens: int  # prompt + every token after it; the model's context
    max_observation_chars: int = 120
    command_timeout_s: float = 10.0
    exec_threads: int = 8  # tool calls run at once (sandboxes are held per episode; this bounds processes)
    eos_token_id: int | None = None  # a reply ending on it ends the episode; None: only the stop string ends a reply
    chat: ChatEpisodeFormat | None = None  # render through a chat template; None: one plain-text context


@dataclass
class _Episode:
    task: Task
    sample_idx: int
    sandbox: Sandbox
    prompt_text: str
    prompt_ids: tuple[int, ...] = ()
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    pending_observation: str = ""  # the text after the last reply, not yet tokenized
    turns: int = 0
    malformed: int = 0
    ending: str = ""  # "" while live
    call: ToolCall | MalformedCall | None = None  # the reply's call, to run before the next turn
    versions: set[int] = field(default_factory=set)

    @property
    def key(self) -> str:
        return f"{self.task.task_id}#{self.sample_idx}"

    @property
    def context(self) -> str:
        return self.prompt_text + self.text + self.pending_observation


@dataclass(frozen=True)
class EpisodeResult:
    """One finished episode: its completion (the whole episode), the verdict, why it ended."""

    completion: Completion
    verdict: Verdict
    ending: str  # submit | eos | max_turns | context | retokenized
    turns: int
    malformed_calls: int


def run_episodes(tasks: Sequence[Task], group_size: int, params: SamplingParams, generate: Generate, pool,
                 env_for: Callable[[Task], object], settings: EpisodeSettings) -> list[EpisodeResult]:
    """`group_size` episodes of every task (sample_idx 0..group_size-1), in task order; see
    the module docstring. `env_for(task)` gives the multi-turn env (initial_files, max_turns,
    verify). Every episode holds one sandbox of `pool` from start to verdict, so the episodes
    run in waves of at most `pool.size` (all of them at once when the pool is that big)."""
    ids = [task.task_id for task in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"run_episodes got a task twice ({len(ids) - len(set(ids))} repeats); each task once, with group_size")
    keys = [(task, sample_idx) for task in tasks for sample_idx in range(group_size)]
    wave = max(1, int(getattr(pool, "size", len(keys))))
    ended: list[tuple[_Episode, Verdict]] = []
    for number, first in enumerate(range(0, len(keys), wave)):
        wave_params = dataclasses.replace(params, n=1, seed=params.seed + 104729 * number)
        ended += _run_wave(keys[first:first + wave], wave_params, generate, pool, env_for, settings)
    sampled_by = set().union(*(episode.versions for episode, _ in ended))
    if ended and not sampled_by:  # every prompt too long: a setting to change, not an outcome to record
        longest = max((episode for episode, _ in ended), key=lambda episode: len(episode.prompt_text))
        raise ValueError(f"no episode could take a first turn: task {longest.task.task_id}'s prompt is "
                         f"{len(longest.prompt_text)} characters, and with a reply of {params.max_new_tokens} tokens "
                         f"that exceeds the {settings.max_context_tokens}-token context (characters are counted as tokens "
                         "before the first reply); raise model.max_position_embeddings or lower rollout.max_new_tokens")
    return [_result(episode, verdict, max(sampled_by)) for episode, verdict in ended]


def _run_wave(keys: list[tuple[Task, int]], params: SamplingParams, generate: Generate, pool,
              env_for: Callable[[Task], object], settings: EpisodeSettings) -> list[tuple[_Episode, Verdict]]:
    with ExitStack() as held, ThreadPoolExecutor(max_workers=settings.exec_threads, thread_name_prefix="episode") as threads:
        episodes: list[_Episode] = []
        for task, sample_idx in keys:
            sandbox = held.enter_context(pool.acquire())
            sandbox.write_files(env_for(task).initial_files(task))
            prompt = settings.chat.prompt(task.prompt) if settings.chat else task.prompt
            episodes.append(_Episode(task, sample_idx, sandbox, prompt))
        turn = 0
        while live := [episode for episode in episodes if not episode.ending]:
            _one_turn(live, turn, params, generate, env_for, settings, threads)
            turn += 1
        verdicts = list(threads.map(lambda e: env_for(e.task).verify(e.task, e.text, e.sandbox), episodes))
    return list(zip(episodes, verdicts))


def _one_turn(live: list[_Episode], turn: int, params: SamplingParams, generate: Generate,
              env_for: Callable[[Task], object], settings: EpisodeSettings, threads: ThreadPoolExecutor) -> None:
    """One reply of every live episode (one generate call, a row per episode: rows draw
    their own random numbers), then its tool call."""
    for episode in live:  # the next context must leave room for a whole reply (characters >= tokens)
        if len(episode.prompt_ids or episode.prompt_text) + len(episode.token_ids) + len(episode.pending_observation) + params.max_new_tokens \
                > settings.max_context_tokens:
            episode.ending = "context"
    live = [episode for episode in live if not episode.ending]
    if not live:
        return
    completions, _ = generate([(episode.key, episode.context) for episode in live],
                              dataclasses.replace(params, seed=params.seed + 7919 * turn))
    by_key = {completion.task_id: completion for completion in completions}
    for episode in live:
        completion = by_key.get(episode.key)
        if completion is None:
            raise RuntimeError(f"the engine returned no reply for episode {episode.key} (turn {turn})")
        _take_reply(episode, completion, params, env_for(episode.task).max_turns, settings)
    acting = [episode for episode in live if episode.call is not None]  # includes those that just hit max_turns
    for episode, observation in zip(acting, threads.map(lambda e: _act(e, settings), acting)):
        episode.pending_observation = settings.chat.observation(observation) if settings.chat else observation
        episode.call = None


def _take_reply(episode: _Episode, completion: Completion, params: SamplingParams, max_turns: int,
                settings: EpisodeSettings) -> None:
    """Append the observation tokens the engine just fed and the reply it sampled; decide
    whether the episode goes on (then `episode.call` is the call to run)."""
    prompt_ids = tuple(completion.prompt_token_ids)
    if not episode.prompt_ids:
        episode.prompt_ids = prompt_ids
    else:
        seen = episode.prompt_ids + tuple(episode.token_ids)
        if prompt_ids[:len(seen)] != seen:
            episode.ending = "retokenized"  # this reply was sampled on other tokens: not kept
            return
        observation_ids = prompt_ids[len(seen):]
        episode.token_ids += observation_ids
        episode.logprobs += [0.0] * len(observation_ids)
        episode.mask += [0] * len(observation_ids)
        episode.text += episode.pending_observation
    episode.pending_observation = ""
    episode.versions.add(completion.policy_version)
    episode.token_ids += completion.token_ids
    episode.logprobs += completion.logprobs
    episode.mask += [1] * len(completion.token_ids)
    episode.turns += 1
    ended_by_eos = settings.eos_token_id is not None and completion.token_ids[-1:] == (settings.eos_token_id,)
    # the reply's text is cut before the stop string; the context goes on after it
    if settings.chat is not None:  # a reply is always closed, as the template renders it
        episode.text += completion.text + settings.chat.turn_end
    else:
        episode.text += completion.text + (params.stop[0] if completion.finish_reason == "stop" and not ended_by_eos else "")
    call = parse_tool_call(completion.text)
    if isinstance(call, MalformedCall):
        episode.malformed += 1
    if ended_by_eos:
        episode.ending = "eos"  # the policy ended its output: the verifier judges what it left
    elif isinstance(call, ToolCall) and call.name == "submit":
        episode.ending = "submit"
    else:
        episode.call = call  # run even on the last turn: what it changes counts
        if episode.turns >= max_turns:
            episode.ending = "max_turns"


def _act(episode: _Episode, settings: EpisodeSettings) -> str:
    """Run the episode's call in its sandbox; the observation text (ends with a newline)."""
    call = episode.call
    if isinstance(call, MalformedCall):
        return f"error: {call.kind}\n"
    try:
        if call.name == "bash":
            ran = episode.sandbox.exec(["bash", "-c", call.arguments["command"]], timeout_s=settings.command_timeout_s)
            output = (ran.stdout + ran.stderr).strip()
            status = "" if ran.exit_code == 0 else (" [timeout]" if ran.timed_out else f" [exit {ran.exit_code}]")
            return f"out: {_cut(output, settings.max_observation_chars)}{status}\n"
        path = _work_relative(call.arguments["path"])
        if call.name == "read_file":
            content = episode.sandbox.read_file(path).decode("utf-8", errors="replace").strip()
            return f"out: {_cut(content, settings.max_observation_chars)}\n"
        episode.sandbox.write_files({path: call.arguments["content"].encode()})
        return "out: ok\n"
    except (OSError, ValueError, RuntimeError) as exc:  # a missing file, a path outside /work
        return f"error: {call.name}: {_cut(str(exc), 60)}\n"


def _work_relative(path: str) -> str:
    path = path.strip()
    if path.startswith("/work/"):
        return path[len("/work/"):]
    return path[2:] if path.startswith("./") else path


def _cut(text: str, max_chars: int) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= max_chars else text[:max_chars] + "..."


def _result(episode: _Episode, verdict: Verdict, newest_version: int) -> EpisodeResult:
    """The episode as one completion; one that ended before its first reply (its prompt left no
    room in the context) is recorded with no tokens, under the newest policy version that
    sampled the other episodes of the call."""
    if len(episode.versions) > 1:
        raise RuntimeError(f"episode {episode.key} was sampled by policy versions {sorted(episode.versions)}; "
                           "an episode must be on-policy for one version")
    completion = Completion(
        task_id=episode.task.task_id, sample_idx=episode.sample_idx, text=episode.text,
        prompt_token_ids=episode.prompt_ids, token_ids=tuple(episode.token_ids), logprobs=tuple(episode.logprobs),
        finish_reason="stop" if episode.ending in ("submit", "eos") else "length",
        policy_version=next(iter(episode.versions), newest_version), loss_mask=tuple(episode.mask))
    return EpisodeResult(completion, verdict, episode.ending, episode.turns, episode.malformed)
