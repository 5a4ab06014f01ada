"""The policy agent: a language model through an engine, with context management for long episodes.

Each turn the loop (agents/trial.py) hands the agent the conversation so far: the system
prompt (the tools' JSON schemas and the call format of docs/AGENTS.md), the instruction, then
each reply and its tool result. The agent

1. turns it into chat messages: tool results become `user` messages headed "Tool result:"
   (small chat models' templates know only system, user and assistant), and a result longer
   than `max_observation_chars` is cut in the middle, its head and tail kept, with a marker
   saying how many characters were cut (the loop's record keeps the longer text);
2. renders them with the model's chat template, the assistant turn opened (`ChatEngine.render`:
   the text and its token count, from the engine's own tokenizer);
3. when prompt + `max_new_tokens` exceeds `context_tokens`, DROPS the oldest turns (a reply
   and its result, never the system prompt or the instruction, always keeping the latest
   turn) and says so in a note appended to the instruction ("[The first k of your turns ...
   were dropped ...]"); turns once dropped stay dropped, so the prompt's prefix changes only
   when the window fills again. Nothing is summarised (a summary would cost a generation
   and could invent facts);
4. ends the episode with ContextExhausted (verdict `context_exhausted`, agent family) when
   the prompt does not fit even with every droppable turn dropped, or when the episode's
   token budget (`episode_tokens`: prompt + generated tokens summed over its turns) cannot
   pay for the next call (its prompt + `max_new_tokens`);
5. samples one reply (`ChatEngine.generate`) and returns its text. The loop parses the tool
   call with tools.parse_tool_call, answers and counts malformed ones.

`ChatEngine` is our protocol; controller/eval_policy.py implements it over the engine worker
(workers/client.EngineClient: hf, vllm or an OpenAI-compatible server), and unit tests fake
it. `PolicyOptions` is what `rlpipe eval --agent policy` records in EVAL.json (so a resume
builds the same agent). What it does not do: load a model, tokenize, or sample itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Literal, Protocol

from rlpipe.agents.agents import Agent, AgentFactory, ContextExhausted, Message
from rlpipe.agents.task_format import AgentTask
from rlpipe.agents.tools import CHAT_SYSTEM_PROMPT
from rlpipe.core.errors import ConfigError
from rlpipe.sandbox.base import WORK

POLICY_AGENT = "policy"
TOOL_RESULT_HEADER = "Tool result:\n"
SYSTEM_PROMPTS = ("suite", "training")
"""suite: the loop's own system prompt (agents/trial.py, the tools' schemas); training: the
short one the agent_tasks chat episodes train with (agents/tools.py CHAT_SYSTEM_PROMPT), so
a policy trained there is evaluated on the prompt it learned."""


@dataclass(frozen=True)
class ContextOptions:
    """How a policy agent keeps a long episode inside its model's window."""

    context_tokens: int = 4096  # the window: prompt + max_new_tokens of one call
    episode_tokens: int | None = None  # prompt + generated tokens summed over the episode; None: unlimited
    max_observation_chars: int = 2000  # a longer tool result is cut in the middle (head and tail kept)

    def __post_init__(self) -> None:
        for name in ("context_tokens", "max_observation_chars"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} {getattr(self, name)} must be at least 1", hint="e.g. --context-tokens 4096")
        if self.episode_tokens is not None and self.episode_tokens < 1:
            raise ConfigError(f"episode_tokens {self.episode_tokens} must be at least 1 (or unset: no budget)",
                              hint="e.g. --episode-tokens 100000")


@dataclass(frozen=True)
class RenderedPrompt:
    """A conversation rendered by the model's chat template, and how many tokens it encodes to."""

    text: str
    token_count: int


@dataclass(frozen=True)
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # stop or length


class ChatEngine(Protocol):
    """What the policy agent needs of a model (controller/eval_policy.py: the engine worker)."""

    @property
    def max_new_tokens(self) -> int: ...

    def render(self, messages: tuple[tuple[str, str], ...]) -> RenderedPrompt:
        """(role, content) pairs through the chat template, the assistant turn opened."""
        ...

    def generate(self, prompt: RenderedPrompt, task_id: str) -> Generation:
        """One reply to the rendered prompt."""
        ...


@dataclass(frozen=True)
class PolicyOptions:
    """The policy agent of an eval, as recorded in EVAL.json (`agent_options`).

    The model: `policy` (an HF folder, e.g. a checkpoint's step folder) or `gguf` (a GGUF
    file, converted once to an HF folder beside it); with engine = openai, the server at
    `openai_base_url` generates and `policy`/`gguf` give the tokenizer (its chat template).
    `config`: a run config TOML whose [model] and [rollout] tables the engine worker starts
    from (device, dtype, engine_python, ...); the options here override them.
    Sampling: temperature 0 is greedy. `system_prompt`: one of SYSTEM_PROMPTS."""

    engine: Literal["hf", "vllm", "openai"] = "hf"
    policy: str | None = None
    gguf: str | None = None
    openai_base_url: str | None = None
    openai_model: str | None = None
    config: str | None = None
    device: str | None = None  # None: the config's model.device (auto: cuda when there is one, else cpu)
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0
    context_tokens: int = 4096
    episode_tokens: int | None = None
    max_observation_chars: int = 2000
    system_prompt: str = "suite"

    def __post_init__(self) -> None:
        if self.system_prompt not in SYSTEM_PROMPTS:
            raise ConfigError(f"unknown system prompt {self.system_prompt!r}", hint=f"one of {', '.join(SYSTEM_PROMPTS)}")
        if (self.policy is None) == (self.gguf is None):
            raise ConfigError("the policy agent needs exactly one model: --policy DIR (an HF folder, e.g. a checkpoint's "
                              "step folder) or --gguf FILE", hint="e.g. --agent policy --gguf models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        if self.engine == "openai" and not self.openai_base_url:
            raise ConfigError("engine openai needs --openai-base-url", hint="e.g. --openai-base-url http://127.0.0.1:8000/v1")
        if self.engine != "openai" and (self.openai_base_url or self.openai_model):
            raise ConfigError(f"--openai-base-url/--openai-model are for the openai engine, not {self.engine!r}",
                              hint="add --engine openai, or drop them")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.max_new_tokens < 1:
            raise ConfigError(f"sampling: temperature {self.temperature} (>= 0; 0 = greedy), top_p {self.top_p} (in (0, 1]), "
                              f"max_new_tokens {self.max_new_tokens} (>= 1)", hint="e.g. --temperature 0 --max-new-tokens 256")
        if self.max_new_tokens >= self.context_tokens:
            raise ConfigError(f"--max-new-tokens {self.max_new_tokens} leaves no room for a prompt in --context-tokens "
                              f"{self.context_tokens}", hint="raise --context-tokens or lower --max-new-tokens")
        self.context()  # validates the context options

    def context(self) -> ContextOptions:
        return ContextOptions(self.context_tokens, self.episode_tokens, self.max_observation_chars)

    def system_override(self) -> str | None:
        """The system prompt in place of the loop's, or None to keep the loop's."""
        return CHAT_SYSTEM_PROMPT if self.system_prompt == "training" else None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, object]) -> PolicyOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown policy agent options {unknown}", hint=f"known: {sorted(known)}")
        return cls(**values)


def cut_middle(text: str, max_chars: int) -> str:
    """`text`, or its head and tail with a marker saying how many characters were cut."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[len(text) - tail:]}"


class PolicyAgent:
    """One episode of a model through a ChatEngine (state: turns dropped, tokens spent).
    `system`: a system prompt in place of the conversation's (None: the conversation's)."""

    def __init__(self, engine: ChatEngine, options: ContextOptions, task_id: str, system: str | None = None) -> None:
        self._engine = engine
        self._options = options
        self._task_id = task_id
        self._system = system
        self.dropped_turns = 0
        self.tokens_used = 0  # prompt + generated tokens of every call so far

    def act(self, messages: Sequence[Message]) -> str:
        system, instruction, turns = _split(messages)
        system = system if self._system is None else self._system
        max_new = self._engine.max_new_tokens
        last_droppable = max(0, len(turns) - 1)  # the latest turn always stays
        dropped = min(self.dropped_turns, last_droppable)
        while True:
            prompt = self._engine.render(self._chat(system, instruction, turns, dropped))
            if prompt.token_count + max_new <= self._options.context_tokens:
                break
            if dropped >= last_droppable:
                raise ContextExhausted(
                    f"context window full: the prompt is {prompt.token_count} tokens with {dropped} of {len(turns)} turns "
                    f"dropped, and {prompt.token_count} + {max_new} new tokens > {self._options.context_tokens} "
                    "(raise --context-tokens, lower --max-observation-chars or --max-new-tokens)")
            dropped += 1
        self.dropped_turns = dropped
        budget = self._options.episode_tokens
        if budget is not None and self.tokens_used + prompt.token_count + max_new > budget:
            raise ContextExhausted(
                f"episode token budget spent: {self.tokens_used} tokens used, the next call needs {prompt.token_count} "
                f"+ {max_new} of the {budget} (raise --episode-tokens)")
        generation = self._engine.generate(prompt, self._task_id)
        self.tokens_used += generation.prompt_tokens + generation.completion_tokens
        return generation.text

    def _chat(self, system: str, instruction: str, turns: list[tuple[str, str]], dropped: int) -> tuple[tuple[str, str], ...]:
        if dropped:
            instruction += (f"\n\n[The first {dropped} of your turns (your tool calls and their results) were dropped "
                            "to fit the context window.]")
        chat = [("system", system), ("user", instruction)]
        for reply, result in turns[dropped:]:
            chat.append(("assistant", reply))
            if result is not None:
                chat.append(("user", TOOL_RESULT_HEADER + cut_middle(result, self._options.max_observation_chars)))
        return tuple(chat)


def _split(messages: Sequence[Message]) -> tuple[str, str, list[tuple[str, str | None]]]:
    """(system prompt, instruction, [(reply, tool result), ...]) of the loop's conversation."""
    if len(messages) < 2 or messages[0].role != "system" or messages[1].role != "user":
        raise ValueError("the conversation must start with the system prompt and the instruction")
    turns: list[tuple[str, str | None]] = []
    for message in messages[2:]:
        if message.role == "assistant":
            turns.append((message.content, None))
        elif message.role == "tool" and turns and turns[-1][1] is None:
            turns[-1] = (turns[-1][0], message.content)
        else:
            raise ValueError(f"unexpected {message.role} message after {len(turns)} turns")
    return messages[0].content, messages[1].content, turns


def policy_agent_factory(engine: ChatEngine, options: ContextOptions, system: str | None = None) -> AgentFactory:
    """Agents of one eval, one per trial, all through `engine`; `system` (PolicyOptions.
    system_override) replaces the loop's system prompt, with /work as the task's work dir."""

    def build(task: AgentTask) -> Agent:
        own = None if system is None else system.replace(WORK, task.workdir)
        return PolicyAgent(engine, options, task.task_id, own)

    return build
