"""The policy agent over a fake of OUR ChatEngine protocol: rendering, truncation of tool
results, dropping the oldest turns, the episode token budget, and whole trials on bubblewrap.

The fake counts 10 tokens per message, so every number below is simple arithmetic."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import dataclasses

import pytest

from rlpipe.agents.agents import ContextExhausted, Message
from rlpipe.agents.policy import ContextOptions, Generation, PolicyAgent, PolicyOptions, RenderedPrompt, policy_agent_factory
from rlpipe.agents.records import Ending, TrialVerdict
from rlpipe.agents.task_format import builtin_suite_dir, load_task
from rlpipe.agents.tools import CHAT_SYSTEM_PROMPT, tool_call_json
from rlpipe.agents.trial import run_trial
from rlpipe.cli.agent_options import EngineName, policy_options
from rlpipe.core.errors import ConfigError, UserError
from tests.agents.test_trial import FIX
from tests.cli.cli_process import error_lines, run_rlpipe
from tests.sandbox._bwrap_support import require_bwrap

TOKENS_PER_MESSAGE = 10
COMPLETION_TOKENS = 7


class FakeChatEngine:
    """Renders nothing real: remembers each prompt's messages; 10 tokens a message; replies in order."""

    def __init__(self, replies: Sequence[str] = (), max_new_tokens: int = 5) -> None:
        self.replies = list(replies)
        self.rendered: list[tuple[tuple[str, str], ...]] = []
        self.generated: list[tuple[tuple[str, str], ...]] = []
        self._max_new_tokens = max_new_tokens

    @property
    def max_new_tokens(self) -> int:
        return self._max_new_tokens

    def render(self, messages: tuple[tuple[str, str], ...]) -> RenderedPrompt:
        self.rendered.append(messages)
        return RenderedPrompt(repr(messages), TOKENS_PER_MESSAGE * len(messages))

    def generate(self, prompt: RenderedPrompt, task_id: str) -> Generation:
        self.generated.append(self.rendered[-1])
        text = self.replies.pop(0) if self.replies else tool_call_json("submit")
        return Generation(text, prompt.token_count, COMPLETION_TOKENS, "stop")


def conversation(turns: int, observation: str = "out") -> list[Message]:
    messages = [Message("system", "S"), Message("user", "I")]
    for turn in range(turns):
        messages += [Message("assistant", f"reply {turn}"), Message("tool", f"{observation} {turn}")]
    return messages


def test_tool_results_are_user_messages_cut_in_the_middle_with_a_marker():
    engine = FakeChatEngine()
    agent = PolicyAgent(engine, ContextOptions(context_tokens=10_000, max_observation_chars=20), "t")
    agent.act([Message("system", "S"), Message("user", "I"), Message("assistant", "R1"), Message("tool", "a" * 30 + "b" * 20)])
    # 50 characters, 20 kept: the first 10 and the last 10, 50 - 20 = 30 cut
    assert engine.generated[-1] == (("system", "S"), ("user", "I"), ("assistant", "R1"),
                                    ("user", "Tool result:\n" + "a" * 10 + "\n[... 30 characters cut ...]\n" + "b" * 10))


def test_the_oldest_turns_are_dropped_when_the_window_fills_and_stay_dropped():
    engine = FakeChatEngine(max_new_tokens=5)
    agent = PolicyAgent(engine, ContextOptions(context_tokens=65), "t")
    agent.act(conversation(4))
    # prompt = 20 (system + instruction) + 20 per turn; 20 + 20 n + 5 <= 65 -> n <= 2: 4 - 2 = 2 turns dropped
    prompt = engine.generated[-1]
    assert agent.dropped_turns == 2 and len(prompt) == 2 + 2 * 2
    assert prompt[1][1].startswith("I\n\n[The first 2 of your turns") and prompt[2] == ("assistant", "reply 2")
    agent.act(conversation(5))
    # 5 turns: 3 stay dropped (5 - 2 = 3 turns: 85 > 65), then a 4th: 2 turns left, 65 fits
    assert agent.dropped_turns == 3 and engine.generated[-1][2] == ("assistant", "reply 3")
    assert "The first 3 of your turns" in engine.generated[-1][1][1]


def test_a_prompt_that_cannot_fit_even_with_every_old_turn_dropped_exhausts_the_context():
    fits = PolicyAgent(FakeChatEngine(max_new_tokens=5), ContextOptions(context_tokens=45), "t")
    fits.act(conversation(3))  # the latest turn alone: 20 + 20 + 5 = 45 <= 45
    assert fits.dropped_turns == 2
    full = PolicyAgent(FakeChatEngine(max_new_tokens=5), ContextOptions(context_tokens=44), "t")
    with pytest.raises(ContextExhausted, match=r"context window full: the prompt is 40 tokens with 2 of 3 turns dropped"):
        full.act(conversation(3))


def test_the_episode_token_budget_ends_the_episode_before_a_call_it_cannot_pay_for():
    engine = FakeChatEngine(max_new_tokens=5)
    agent = PolicyAgent(engine, ContextOptions(context_tokens=10_000, episode_tokens=100), "t")
    agent.act(conversation(0))  # 0 + 20 + 5 <= 100; used 20 + 7 = 27
    agent.act(conversation(1))  # 27 + 40 + 5 = 72 <= 100; used 27 + 40 + 7 = 74
    assert agent.tokens_used == 74
    with pytest.raises(ContextExhausted, match="74 tokens used, the next call needs 60 \\+ 5 of the 100"):
        agent.act(conversation(2))  # 74 + 60 + 5 = 139 > 100
    assert len(engine.generated) == 2


@pytest.mark.parametrize(("options", "error"), [
    ({}, "exactly one model"),
    ({"gguf": "a.gguf", "policy": "dir"}, "exactly one model"),
    ({"gguf": "a.gguf", "engine": "openai"}, "--openai-base-url"),
    ({"gguf": "a.gguf", "openai_model": "m"}, "are for the openai engine"),
    ({"gguf": "a.gguf", "max_new_tokens": 4096}, "leaves no room"),
    ({"gguf": "a.gguf", "episode_tokens": 0}, "episode_tokens 0"),
    ({"gguf": "a.gguf", "system_prompt": "short"}, "unknown system prompt 'short'"),
])
def test_policy_options_refuse_contradictions(options, error):
    with pytest.raises(ConfigError, match=error):
        PolicyOptions(**options)


def test_policy_options_round_trip_through_the_eval_record():
    options = PolicyOptions(gguf="/m.gguf", temperature=0.7, episode_tokens=5000)
    assert PolicyOptions.from_dict(options.to_dict()) == options
    with pytest.raises(ConfigError, match="unknown policy agent options"):
        PolicyOptions.from_dict({**options.to_dict(), "beam": 4})


@pytest.mark.parametrize("workdir", ["/work", "/app"])
def test_the_training_system_prompt_replaces_the_loops_and_names_the_tasks_work_dir(workdir):
    task = dataclasses.replace(load_task(builtin_suite_dir() / "fix-median-bug"), workdir=workdir)
    chosen = PolicyOptions(gguf="/m.gguf", system_prompt="training")
    engine = FakeChatEngine()
    policy_agent_factory(engine, chosen.context(), chosen.system_override())(task).act(conversation(1))
    assert engine.generated[-1][0] == ("system", CHAT_SYSTEM_PROMPT.replace("/work", workdir))
    assert f"working directory is {workdir}." in engine.generated[-1][0][1]
    assert engine.generated[-1][1:] == (("user", "I"), ("assistant", "reply 0"), ("user", "Tool result:\nout 0"))
    suite = FakeChatEngine()
    default = PolicyOptions(gguf="/m.gguf")
    policy_agent_factory(suite, default.context(), default.system_override())(task).act(conversation(1))
    assert suite.generated[-1][0] == ("system", "S")


def policy_trial(engine: FakeChatEngine, options: ContextOptions):
    require_bwrap()
    task = load_task(builtin_suite_dir() / "fix-median-bug")
    return run_trial(task, "policy", policy_agent_factory(engine, options), "bwrap")


@pytest.mark.bwrap
def test_a_policy_trial_records_malformed_replies_and_passes_with_the_fix():
    engine = FakeChatEngine(["I think I should look at the files.", tool_call_json("bash", command=FIX),
                             "<tool_call>" + tool_call_json("submit") + "</tool_call>"])
    result = policy_trial(engine, ContextOptions())
    assert (result.verdict, result.ending) == (TrialVerdict.PASSED, Ending.SUBMITTED)
    assert [(step.tool, step.malformed_kind) for step in result.steps] == [(None, "no_call"), ("bash", None), ("submit", None)]
    assert result.malformed_counts == {"no_call": 1}
    # the second prompt showed the agent its malformed reply and the loop's error as a tool result
    assert engine.generated[1][2][0] == "assistant" and engine.generated[1][3][1].startswith("Tool result:\nerror: malformed")
    assert result.steps[1].tree_sha256 is not None and len(result.steps[1].tree_sha256) == 64


@pytest.mark.bwrap
def test_a_spent_budget_is_the_agent_verdict_context_exhausted():
    engine = FakeChatEngine([tool_call_json("bash", command="ls")] * 5)
    # turn 1: 20 + 5 <= 60, used 27; turn 2: 27 + 40 + 5 = 72 > 60
    result = policy_trial(engine, ContextOptions(episode_tokens=60))
    assert (result.verdict, result.ending, result.verdict.family) == (TrialVerdict.CONTEXT_EXHAUSTED, Ending.CONTEXT_EXHAUSTED, "agent")
    assert len(result.steps) == 1 and "episode token budget spent" in result.detail


@pytest.mark.parametrize(("agent", "given", "error"), [
    ("noop", {"gguf": Path("m.gguf")}, "--gguf are options of the policy agent, not of --agent noop"),
    ("policy", {}, "exactly one model"),
    ("policy", {"gguf": Path("absent.gguf")}, "--gguf absent.gguf: no such file"),
    ("policy", {"policy": Path(".")}, "is not an HF model folder"),
    (None, {"gguf": Path("m.gguf")}, "--resume goes on with the agent options recorded in EVAL.json, not --gguf"),
    ("oracle", {"system_prompt": "training"}, "--system-prompt are options of the policy agent, not of --agent oracle"),
])
def test_the_cli_policy_options_are_checked(agent, given, error):
    defaults = dict(policy=None, gguf=None, engine=EngineName.hf, openai_base_url=None, openai_model=None, config=None,
                    device=None, temperature=0.0, top_p=1.0, max_new_tokens=256, seed=0, context_tokens=4096,
                    episode_tokens=None, max_observation_chars=2000)
    with pytest.raises(UserError, match=error):
        policy_options(agent, **{**defaults, **given})


def test_policy_options_without_the_policy_agent_exit_2(tmp_path):
    ran = run_rlpipe(["eval", "--agent", "oracle", "--episode-tokens", "100"], cwd=tmp_path, timeout_s=60)
    assert ran.returncode == 2 and "--episode-tokens are options of the policy agent" in error_lines(ran)[0]
