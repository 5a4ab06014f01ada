"""The policy agent with a real (tiny, random) HF model behind the engine worker: the worker
renders the conversation with the tokenizer's chat template and counts its tokens, generates
each reply, and the trial records what the model said (malformed, here) on bubblewrap."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpipe.agents.policy import ContextOptions, PolicyOptions, policy_agent_factory
from rlpipe.agents.records import Ending, TrialVerdict
from rlpipe.agents.task_format import builtin_suite_dir, load_task
from rlpipe.agents.trial import SYSTEM_PROMPT, run_trial
from rlpipe.controller.eval_policy import open_policy_engine
from rlpipe.engines.sampling import render_chat
from rlpipe.rl.policy import build_char_tokenizer, build_tiny_model
from tests.sandbox._bwrap_support import require_bwrap

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def save_tiny_chat_model(folder: Path, chat_template: str | None = TEMPLATE) -> Path:
    tokenizer = build_char_tokenizer()
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    model = build_tiny_model("qwen2", len(tokenizer), hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64,
                             max_position_embeddings=4096, seed=0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    options = PolicyOptions(policy=str(save_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))), max_new_tokens=8,
                            temperature=1.0, seed=3)
    opened = open_policy_engine(options, "test-policy-worker")
    yield opened
    opened.close()


def assert_renders_and_replies(engine) -> None:
    """TEMPLATE's rendering and its token count, and one reply of at most 8 tokens to it."""
    rendered = engine.render((("system", "ab"), ("user", "cd")))
    # the template gives "<system>ab\n<user>cd\n<assistant>", one token per character (char tokenizer):
    # (8 + 2 + 1) + (6 + 2 + 1) + 11 = 31
    assert rendered.text == "<system>ab\n<user>cd\n<assistant>" and rendered.token_count == 31
    generation = engine.generate(rendered, "t")
    assert generation.prompt_tokens == 31 and 1 <= generation.completion_tokens <= 8


def test_the_worker_renders_with_the_chat_template_and_counts_the_tokens(engine):
    assert_renders_and_replies(engine)


@pytest.mark.bwrap
def test_a_trial_with_a_real_model_records_its_replies_and_a_window_too_small_exhausts_the_context(engine):
    require_bwrap()
    task = load_task(builtin_suite_dir() / "fix-median-bug")
    result = run_trial(task, "policy", policy_agent_factory(engine, ContextOptions(context_tokens=4000)), "bwrap")
    # a random model writes no tool call: 3 malformed replies in a row end the episode, the tests fail
    assert (result.verdict, result.ending) == (TrialVerdict.MALFORMED_CALLS, Ending.MALFORMED_CALLS)
    assert len(result.steps) == 3 and all(step.malformed_kind is not None for step in result.steps)
    assert sum(result.malformed_counts.values()) == 3
    # the system prompt alone is longer than 100 tokens: no call is made
    assert len(SYSTEM_PROMPT) > 100
    small = run_trial(task, "policy", policy_agent_factory(engine, ContextOptions(context_tokens=100)), "bwrap")
    assert (small.verdict, small.ending, small.steps) == (TrialVerdict.CONTEXT_EXHAUSTED, Ending.CONTEXT_EXHAUSTED, ())
    assert "context window full" in small.detail


def test_a_model_without_a_chat_template_cannot_render_a_conversation():
    # in process (a second worker would cost its start-up): the worker raises this as a ConfigError
    with pytest.raises(ValueError, match="has no chat template"):
        render_chat(build_char_tokenizer(), [{"role": "user", "content": "hi"}])
