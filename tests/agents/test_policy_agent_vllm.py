"""The policy agent of `rlpipe eval --agent policy` through the vllm and openai engines (what
tests/agents/test_policy_worker.py checks for hf), as a user runs it: this venv's controller,
the engine worker in .venv-vllm (`make venv-vllm`; controller/runtime.py engine_python), which
renders the conversation with the tokenizer's chat template, counts its tokens and
generates each reply with vLLM (`--engine vllm`) or through a `vllm serve` on 127.0.0.1
started by .venv-vllm's Python (`--engine openai`); a whole trial on bubblewrap records what
the model said. Skipped where there is no .venv-vllm (CI); `make test-vllm` runs it.

The model is a tiny random Qwen2 (head size 32, the smallest vLLM's CPU attention takes) with
a chat template and a 4096-token window: it writes no tool call, so a trial ends after three
malformed replies; what is tested is the path, not the model.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rlpipe.agents.policy import ContextOptions, PolicyOptions, policy_agent_factory
from rlpipe.agents.records import Ending, TrialVerdict
from rlpipe.agents.task_format import builtin_suite_dir, load_task
from rlpipe.agents.trial import run_trial
from rlpipe.controller.eval_policy import WorkerChatEngine, open_policy_engine
from rlpipe.rl.policy import build_char_tokenizer, build_tiny_model
from tests.agents.test_policy_worker import TEMPLATE, assert_renders_and_replies
from tests.cli.cli_process import REPO_ROOT
from tests.sandbox._bwrap_support import require_bwrap
from tests.vllm.conftest import MODEL_SHAPE
from tests.vllm.serve import vllm_server

VLLM_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"
pytestmark = pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no .venv-vllm here: `make test-vllm` makes it and runs this")

WINDOW = 4096


@pytest.fixture(scope="module")
def chat_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-chat-policy")
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    model = build_tiny_model(vocab_size=len(tokenizer), seed=0, **{**MODEL_SHAPE, "max_position_embeddings": WINDOW})
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["vllm", "openai"])
def engine(request, chat_policy: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerChatEngine]:
    def options(**server: str) -> PolicyOptions:
        return PolicyOptions(engine=request.param, policy=str(chat_policy), max_new_tokens=8, temperature=1.0, seed=3,
                             context_tokens=WINDOW, config=str(config), **server)

    config = tmp_path_factory.mktemp("engine-config") / "engine.toml"  # the worker's interpreter: .venv-vllm's
    config.write_text(f'[rollout]\nengine_python = "{VLLM_PYTHON}"\n')

    if request.param == "vllm":
        opened = open_policy_engine(options(), "test-policy-vllm")
        yield opened
        opened.close()
        return
    with vllm_server(str(VLLM_PYTHON), chat_policy, WINDOW, tmp_path_factory.mktemp("serve-chat")) as base_url:
        opened = open_policy_engine(options(openai_base_url=base_url), "test-policy-openai")
        yield opened
        opened.close()


def test_the_engine_renders_with_the_chat_template_and_counts_the_prompt_it_generates_from(engine):
    assert_renders_and_replies(engine)


def test_a_trial_through_the_engine_records_its_replies(engine):
    require_bwrap()
    task = load_task(builtin_suite_dir() / "fix-median-bug")
    result = run_trial(task, "policy", policy_agent_factory(engine, ContextOptions(context_tokens=WINDOW)), "bwrap")
    # a random model writes no tool call: 3 malformed replies in a row end the episode, the tests fail
    assert (result.verdict, result.ending) == (TrialVerdict.MALFORMED_CALLS, Ending.MALFORMED_CALLS), result.detail
    assert len(result.steps) == 3 and all(step.malformed_kind is not None and step.reply for step in result.steps)
