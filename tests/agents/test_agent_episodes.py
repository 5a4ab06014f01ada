"""Agent RL episodes (agents/episodes.py, envs/agent_tasks.py): the procedurally generated
tasks, whole episodes in a real bubblewrap pool with a scripted engine (a fake of the
Generate protocol whose tokens are character codes), and the loss mask: tool output is in
the stored sequence but never in the loss."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rlpipe.agents.episodes import EpisodeSettings, run_episodes
from rlpipe.controller.agent_episodes import OracleEngine
from rlpipe.core.records import Completion
from rlpipe.engines.sampling import SamplingParams
from rlpipe.envs.agent_tasks import KEYS, AgentTasksEnv, call_text
from rlpipe.sandbox.base import Limits
from tests.sandbox._bwrap_support import require_bwrap

PARAMS = SamplingParams(n=1, max_new_tokens=80, stop=("\n",), greedy=True)
SETTINGS = EpisodeSettings(max_context_tokens=400)


@pytest.fixture(scope="module")
def pool():
    require_bwrap()
    from rlpipe.sandbox.bwrap import BwrapSandbox
    from rlpipe.sandbox.pool import SandboxPool

    with SandboxPool(lambda: BwrapSandbox(Limits(timeout_s=10.0)), size=3) as sandboxes:
        yield sandboxes


class ScriptedEngine:
    """Replies a fixed list of texts per episode (then the last again); each reply token's
    logprob is -(its position in the reply + 1), so a test can tell where every one landed."""

    def __init__(self, replies: list[str], eos_after: int | None = None) -> None:
        self.replies, self.eos_after = replies, eos_after
        self.calls: dict[str, int] = {}
        self.contexts: list[str] = []

    def generate(self, prompts, params):
        completions = []
        for key, context in prompts:
            index = self.calls.get(key, 0)
            self.calls[key] = index + 1
            self.contexts.append(context)
            reply = self.replies[min(index, len(self.replies) - 1)]
            if self.eos_after is not None and index == self.eos_after:
                tokens = tuple(ord(c) for c in reply) + (0,)  # ended by EOS (id 0 here), no stop string
            else:
                tokens = tuple(ord(c) for c in reply + "\n")
            logprobs = tuple(-(i + 1.0) for i in range(len(tokens)))
            completions.append(Completion(key, int(key.rpartition("#")[2]), reply, tuple(ord(c) for c in context),
                                          tokens, logprobs, "stop", 3))
        return completions, 3


def test_tasks_are_seeded_and_the_splits_disjoint():
    env = AgentTasksEnv()
    train, heldout = env.tasks("train", 300, seed=1), env.tasks("heldout", 300, seed=1)
    assert env.tasks("train", 300, seed=1) == train
    key = lambda task: task.prompt.split()[4]  # noqa: E731 - "put the value of KEY in ans, then submit"
    answer = lambda task: (key(task), json.loads(task.verifier.payload)["value"])  # noqa: E731
    files = lambda task: dict(task.metadata)["files"]  # noqa: E731
    assert not {files(t) for t in train} & {files(t) for t in heldout}  # no held-out task is a training task
    assert len({files(t) for t in train}) == 300
    # the value is drawn whatever the key: every key takes every digit in training, so knowing
    # which values answer a key cannot pass a task; only copying it from the tool output can
    assert {len(value) for _, value in map(answer, train + heldout)} == {env.value_digits} == {1}
    many = env.tasks("train", 1000, seed=1)
    assert all({value for k, value in map(answer, many) if k == name} == set("0123456789") for name in KEYS)
    for task in train[:20]:
        files = env.initial_files(task)
        hits = [line for content in files.values() for line in content.decode().splitlines() if line.startswith(key(task) + "=")]
        assert hits == ["=".join(answer(task))]  # exactly one line has the key; the others are distractors
        assert 2 <= len(files) <= env.max_files


@pytest.mark.bwrap
def test_oracle_succeeds_and_doing_nothing_fails(pool):
    env = AgentTasksEnv()
    tasks = env.tasks("train", 6, seed=2)
    oracle = OracleEngine({task.task_id: env.oracle_turns(task) for task in tasks}, "\n")
    results = run_episodes(tasks, 1, PARAMS, oracle.generate, pool, lambda task: env, SETTINGS)
    assert [result.verdict.passed for result in results] == [True] * 6
    assert {result.ending for result in results} == {"submit"}
    # one warm-start example per episode: the prompt, then its 3 replies (trained) with the 2
    # tool outputs between them (not trained), which extend the context as the episode did
    assert len(oracle.episodes) == 6
    for (prompt, segments), task in zip(oracle.episodes, tasks):
        assert prompt == task.prompt and [trained for _, trained in segments] == [True, False, True, False, True]
        assert [text for text, trained in segments if trained] == [turn + "\n" for turn in env.oracle_turns(task)]
        line = f"{task.prompt.split()[4]}={json.loads(task.verifier.payload)['value']}"
        assert segments[1][0] == f"out: {line}\n" and segments[3][0] == "out: ok\n"
    quitter = ScriptedEngine([call_text("submit")])
    results = run_episodes(tasks, 2, PARAMS, quitter.generate, pool, lambda task: env, SETTINGS)
    assert len(results) == 12 and not any(result.verdict.passed for result in results)
    assert all(result.verdict.reward == 0.0 for result in results)


@pytest.mark.bwrap
def test_an_episode_is_one_sequence_with_tool_output_masked(pool):
    env = AgentTasksEnv()
    task = env.tasks("train", 1, seed=3)[0]
    key, value = task.prompt.split()[4], json.loads(task.verifier.payload)["value"]
    replies = [call_text("bash", command=f"grep -h {key} *"), "not a call", call_text("write_file", path="ans", content=value),
               call_text("submit")]
    engine = ScriptedEngine(replies)
    (result,) = run_episodes([task], 1, PARAMS, engine.generate, pool, lambda t: env, SETTINGS)
    completion = result.completion
    assert result.verdict.passed and result.ending == "submit" and result.turns == 4 and result.malformed_calls == 1
    observations = [f"out: {key}={value}\n", "error: no_call\n", "out: ok\n"]
    expected_text = "".join(reply + "\n" + observation for reply, observation in zip(replies, observations + [""]))
    assert completion.text == expected_text
    # the stored sequence is exactly the last context the engine saw, plus the last reply
    assert completion.prompt_token_ids + completion.token_ids == tuple(ord(c) for c in task.prompt + expected_text)
    assert engine.contexts[-1] == task.prompt + expected_text[: -len(replies[-1]) - 1]
    # mask: 1 on reply tokens, 0 on observation tokens, in order; observations carry logprob 0
    expected_mask = []
    for reply, observation in zip(replies, observations + [""]):
        expected_mask += [1] * (len(reply) + 1) + [0] * len(observation)
    assert list(completion.loss_mask) == expected_mask
    assert all(lp == 0.0 for lp, bit in zip(completion.logprobs, completion.loss_mask) if not bit)
    first_reply = len(replies[0]) + 1
    assert completion.logprobs[:first_reply] == tuple(-(i + 1.0) for i in range(first_reply))
    assert completion.finish_reason == "stop" and completion.policy_version == 3


@pytest.mark.bwrap
def test_limits_end_episodes_and_the_last_call_still_runs(pool):
    env = AgentTasksEnv(max_turns=3)
    task = env.tasks("train", 1, seed=4)[0]
    value = json.loads(task.verifier.payload)["value"]
    # three turns without submit: the third (write) runs, then max_turns ends the episode
    engine = ScriptedEngine(["x", "y", call_text("write_file", path="ans", content=value)])
    (result,) = run_episodes([task], 1, PARAMS, engine.generate, pool, lambda t: env, SETTINGS)
    assert result.ending == "max_turns" and result.verdict.passed and result.completion.finish_reason == "length"
    # EOS ends the episode at once (its call does not run): the verifier judges what is left
    eos = ScriptedEngine([call_text("write_file", path="ans", content=value)], eos_after=0)
    (result,) = run_episodes([task], 1, PARAMS, eos.generate, pool, lambda t: env,
                             EpisodeSettings(max_context_tokens=400, eos_token_id=0))
    assert result.ending == "eos" and not result.verdict.passed and result.turns == 1
    # a context that leaves no room for another whole reply ends the episode
    small = EpisodeSettings(max_context_tokens=len(task.prompt) + 90 + PARAMS.max_new_tokens)
    (result,) = run_episodes([task], 1, PARAMS, ScriptedEngine(["z" * 70]).generate, pool, lambda t: env, small)
    assert result.ending == "context" and len(result.completion.prompt_token_ids) + len(result.completion.token_ids) <= 400


@pytest.mark.bwrap
def test_more_episodes_than_sandboxes_run_in_waves(pool):
    env = AgentTasksEnv()
    tasks = env.tasks("heldout", 4, seed=5)
    oracle = OracleEngine({task.task_id: env.oracle_turns(task) for task in tasks}, "\n")
    results = run_episodes(tasks, 2, PARAMS, oracle.generate, pool, lambda t: env, SETTINGS)  # 8 episodes, 3 sandboxes
    assert [(r.completion.task_id, r.completion.sample_idx) for r in results] == [(t.task_id, i) for t in tasks for i in (0, 1)]
    assert all(result.verdict.passed for result in results)


@pytest.mark.bwrap
def test_a_prompt_with_no_room_for_a_reply_is_recorded_and_a_call_where_none_fits_is_refused(pool):
    env = AgentTasksEnv()
    short, long = env.tasks("train", 2, seed=6)
    long = dataclasses.replace(long, prompt=long.prompt + " Notes: " + "x" * 1000)
    settings = EpisodeSettings(max_context_tokens=len(short.prompt) + 200 + PARAMS.max_new_tokens)
    oracle = OracleEngine({task.task_id: env.oracle_turns(task) for task in (short, long)}, "\n")
    replied, unplayed = run_episodes([short, long], 1, PARAMS, oracle.generate, pool, lambda t: env, settings)
    assert replied.turns >= 1 and replied.completion.token_ids
    assert (unplayed.ending, unplayed.turns, unplayed.completion.token_ids, unplayed.verdict.passed) == ("context", 0, (), False)
    assert unplayed.completion.policy_version == replied.completion.policy_version and unplayed.completion.finish_reason == "length"
    with pytest.raises(ValueError, match="no episode could take a first turn: task .* raise model.max_position_embeddings"):
        run_episodes([long], 2, PARAMS, oracle.generate, pool, lambda t: env, settings)
