"""Chat episodes (agents/episodes.py ChatEpisodeFormat, envs.agent_chat_template): the format
cut from a ChatML template and refused for a template it cannot follow; an oracle episode
in a bubblewrap sandbox whose every context is exactly the template's rendering of the
conversation so far (the policy agent's layout: tool output as "Tool result:" user
messages); the warm-start's example of that episode is the same text, replies trained and
observations masked, with no second EOS after the closed last reply; and, where `make
smollm2` fetched SmolLM2, its tokenizer encodes the warm-start's segments to exactly the
tokens the engine is fed for the whole episode."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpipe.agents.episodes import CHAT_SYSTEM_PROMPT, ChatEpisodeFormat, EpisodeSettings, run_episodes
from rlpipe.agents.policy import TOOL_RESULT_HEADER
from rlpipe.controller.agent_episodes import OracleEngine
from rlpipe.engines.sampling import SamplingParams, render_chat
from rlpipe.envs.agent_task_families import FAMILIES
from rlpipe.envs.agent_tasks import AgentTasksEnv
from rlpipe.rl.policy import build_char_tokenizer
from rlpipe.rl.warmstart import _encode
from rlpipe.sandbox.base import Limits
from tests.sandbox._bwrap_support import require_bwrap

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
END = "<|im_end|>"
SMOLLM2_GGUF = Path(__file__).resolve().parents[2] / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def renderer(template: str):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = template
    return lambda messages: render_chat(tokenizer, [{"role": role, "content": content} for role, content in messages])


def test_the_format_is_cut_from_the_template_and_a_template_it_cannot_follow_is_refused():
    chat = ChatEpisodeFormat.from_template(renderer(CHATML), END)
    assert chat.prompt("do it\n") == renderer(CHATML)((("system", CHAT_SYSTEM_PROMPT), ("user", "do it")))
    assert (chat.turn_end, chat.tool_open, chat.tool_close) == (END, f"\n<|im_start|>user\n{TOOL_RESULT_HEADER}",
                                                                "<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="not the stop string"):
        ChatEpisodeFormat.from_template(renderer(CHATML), "\n")
    # a template that marks the last message renders a longer episode otherwise than its pieces joined
    last_marked = CHATML.replace("message['content'] +", "message['content'] + ('!' if loop.last else '') +")
    with pytest.raises(ValueError):
        ChatEpisodeFormat.from_template(renderer(last_marked), END)


@pytest.fixture(scope="module")
def pool():
    require_bwrap()
    from rlpipe.sandbox.bwrap import BwrapSandbox
    from rlpipe.sandbox.pool import SandboxPool

    with SandboxPool(lambda: BwrapSandbox(Limits(timeout_s=10.0)), size=2) as sandboxes:
        yield sandboxes


def test_a_chat_episode_is_the_conversation_the_template_renders_and_the_warm_start_trains_its_replies(pool):
    render = renderer(CHATML)
    chat = ChatEpisodeFormat.from_template(render, END)
    env = AgentTasksEnv(agent_families=("lookup", "two_step"))
    drawn = env.tasks("train", 40, seed=3)
    tasks = [next(task for task in drawn if "two_step" in task.task_id), next(task for task in drawn if "two_step" not in task.task_id)]
    oracle = OracleEngine({task.task_id: env.oracle_turns(task) for task in tasks}, END)
    contexts: list[tuple[str, str]] = []

    def generate(prompts, params):
        contexts.extend(prompts)
        return oracle.generate(prompts, params)

    params = SamplingParams(n=1, max_new_tokens=200, stop=(END,), greedy=True)
    results = run_episodes(tasks, 1, params, generate, pool, lambda _: env,
                           EpisodeSettings(max_context_tokens=10_000, eos_token_id=1, chat=chat))
    assert all(result.verdict.passed and result.ending == "submit" for result in results), results
    examples = dict(oracle.episodes)
    for task, result in zip(tasks, results):
        replies = env.oracle_turns(task)
        assert result.turns == len(replies)  # EOS (id 1) ended no episode: in chat it ends a turn
        prompt = chat.prompt(task.prompt)
        segments = next(segments for start, segments in examples.items() if start == prompt)
        assert [text for text, trained in segments if trained] == [reply + END for reply in replies]
        observations = [text for text, trained in segments if not trained]
        assert all(text.startswith(chat.tool_open) and text.endswith(chat.tool_close) for text in observations)
        results_text = [text[len(chat.tool_open):-len(chat.tool_close)] for text in observations]
        assert all(text.startswith("out: ") for text in results_text)
        # every context the engine got: the template's rendering of the conversation so far
        messages = [("system", CHAT_SYSTEM_PROMPT), ("user", task.prompt.strip())]
        own = [context for key, context in contexts if key.startswith(task.task_id + "#")]
        for turn, context in enumerate(own):
            assert context == render(tuple(messages))
            messages += [("assistant", replies[turn])] + ([("user", TOOL_RESULT_HEADER + results_text[turn])]
                                                          if turn < len(results_text) else [])
        assert prompt + result.completion.text == render(tuple(messages))[:-len("\n<|im_start|>assistant\n")]  # ends at the end of turn
        assert prompt + "".join(text for text, _ in segments) == prompt + result.completion.text


def test_the_warm_start_adds_no_second_eos_after_a_closed_reply():
    tokenizer = build_char_tokenizer()
    closed = _encode(tokenizer, "p", (("ab" + tokenizer.eos_token, True),))
    plain = _encode(tokenizer, "p", "ab")
    assert closed.token_ids == plain.token_ids and closed.token_ids.count(tokenizer.eos_token_id) == 1


@pytest.mark.extended
@pytest.mark.skipif(not SMOLLM2_GGUF.is_file(), reason=f"SmolLM2 GGUF not fetched ({SMOLLM2_GGUF}); run `make smollm2`")
def test_smollm2_encodes_the_warm_start_segments_as_the_engine_encodes_the_episode():
    from rlpipe.rl.gguf_folder import converted_folder
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted_folder(SMOLLM2_GGUF))
    end = tokenizer.eos_token
    chat = ChatEpisodeFormat.from_template(
        lambda messages: render_chat(tokenizer, [{"role": role, "content": content} for role, content in messages]), end)
    env = AgentTasksEnv(agent_families=FAMILIES)
    for task in env.tasks("train", 40, seed=0):
        replies = env.oracle_turns(task)
        segments = []
        for turn, reply in enumerate(replies):
            segments.append((reply + end, True))
            if turn < len(replies) - 1:
                segments.append((chat.observation("out: port=4 [exit 1]\n"), False))
        sample = _encode(tokenizer, chat.prompt(task.prompt), tuple(segments))
        whole = tokenizer(chat.prompt(task.prompt) + "".join(text for text, _ in segments), add_special_tokens=False)["input_ids"]
        assert list(sample.prompt_token_ids + sample.token_ids) == whole, task.task_id
        trained_ends = [token for token, bit in zip(sample.token_ids, sample.loss_mask) if bit and token == tokenizer.eos_token_id]
        assert sample.token_ids[-1] == tokenizer.eos_token_id and len(trained_ends) == len(replies)
