"""The agent_tasks families (envs/agent_task_families.py, envs/agent_tasks.py agent_families):
the truth of each family recomputed by hand from the generated files, every oracle episode
passing in a real bubblewrap sandbox, and the verifier against the hacks an agent trained on
it could learn: every candidate at once, an empty or huge answer, the answer in words or with
a leading zero, files edited so that /work tells another truth, the gate's own probes."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from rlpipe.controller.agent_episodes import gate_verify
from rlpipe.core.records import VerdictReason
from rlpipe.envs.agent_task_families import FAMILIES, POINTER_KEY
from rlpipe.envs.agent_tasks import MAX_ANSWER_BYTES, AgentTasksEnv, call_text
from rlpipe.envs.mixture import build_env
from rlpipe.sandbox.base import Limits
from tests.sandbox._bwrap_support import require_bwrap

ALL = AgentTasksEnv(agent_families=FAMILIES)


def lines_of(task) -> list[tuple[str, str, str]]:
    files = json.loads(dict(task.metadata)["files"])
    return [(name, *line.split("=")) for name in files for line in files[name].splitlines()]


def family_of(task) -> str:
    return json.loads(task.verifier.payload).get("family", "lookup")


def key_of(task) -> str:
    """The key a task asks about, read from the prompt's words: "... key K in ans, then
    submit" / "... of K in ans, then submit" (not two_step's, whose key is in the files)."""
    return task.prompt.split()[-5]


def by_hand(task) -> str:
    """The answer, worked out from the prompt's words and the files' lines, independently of the env."""
    lines = lines_of(task)
    family = family_of(task)
    if family == "two_step":
        (target,) = [value for _, key, value in lines if key == POINTER_KEY]
        (value,) = [value for _, key, value in lines if key == target]
        return value
    key = key_of(task)
    matching = [(name, value) for name, line_key, value in lines if line_key == key]
    return {"lookup": lambda: matching[0][1], "count": lambda: str(len(matching)),
            "sum": lambda: str(sum(int(value) for _, value in matching)), "which_file": lambda: matching[0][0]}[family]()


def test_every_family_is_drawn_seeded_its_splits_disjoint_and_its_oracle_writes_the_truth():
    train, heldout = ALL.tasks("train", 400, seed=2), ALL.tasks("heldout", 200, seed=2)
    assert ALL.tasks("train", 400, seed=2) == train
    assert {family_of(task) for task in train} == {family_of(task) for task in heldout} == set(FAMILIES)
    files = lambda task: dict(task.metadata)["files"]  # noqa: E731
    assert not {files(t) for t in train} & {files(t) for t in heldout}
    for task in train + heldout:
        truth = by_hand(task)
        oracle = ALL.oracle_turns(task)
        written = json.loads(oracle[-2])["arguments"]["content"]
        assert written == truth == ALL._answer(task), task.task_id
        assert json.loads(oracle[-1])["name"] == "submit" and len(oracle) <= ALL.max_turns
        assert ALL.task_family(task) == family_of(task)  # the family an evaluation reports it under
    counts = [int(by_hand(task)) for task in train if family_of(task) == "count"]
    assert min(counts) >= 1 and len(set(counts)) > 1  # the count varies: no constant answer passes
    for task in train + heldout:  # no sum equals one of its values: copying a value never passes
        if family_of(task) == "sum":
            key = key_of(task)
            values = [value for _, line_key, value in lines_of(task) if line_key == key]
            assert len(values) >= 2 and by_hand(task) not in values, task.task_id


def test_the_default_is_the_lookup_family_and_unknown_families_are_refused():
    assert AgentTasksEnv().families == ("lookup",) and AgentTasksEnv().max_turns == 4
    assert ALL.max_turns == 5  # two_step's oracle takes 4 replies
    assert build_env("agent_tasks", agent_families=["count", "sum"]).families == ("count", "sum")
    for bad in ([], ["lookup", "lookup"], ["grep_everything"]):
        with pytest.raises(ValueError, match="agent_families"):
            AgentTasksEnv(agent_families=bad)
    with pytest.raises(ValueError, match="max_turns must be >= 4"):
        AgentTasksEnv(agent_families=["two_step"], max_turns=3)


def test_two_step_needs_the_first_look_the_key_is_not_in_the_prompt():
    for task in ALL.tasks("train", 200, seed=5):
        if family_of(task) == "two_step":
            target = re.search(r"\^(\w+)=", json.loads(ALL.oracle_turns(task)[1])["arguments"]["command"]).group(1)
            assert target not in task.prompt and sum(1 for _, key, _ in lines_of(task) if key == target) == 1


@pytest.fixture(scope="module")
def pool():
    require_bwrap()
    from rlpipe.sandbox.bwrap import BwrapSandbox
    from rlpipe.sandbox.pool import SandboxPool

    with SandboxPool(lambda: BwrapSandbox(Limits(timeout_s=10.0)), size=2) as sandboxes:
        yield sandboxes


def one_per_family() -> list:
    tasks = ALL.tasks("train", 60, seed=7)
    return [next(task for task in tasks if family_of(task) == family) for family in FAMILIES]


def episode(*replies: str) -> str:
    return json.dumps(list(replies))


def write(content: str) -> str:
    return json.dumps({"name": "write_file", "arguments": {"path": "ans", "content": content}})


def test_oracles_pass_and_the_hacks_score_zero_in_a_sandbox(pool):
    submit = call_text("submit")
    for task in one_per_family():
        truth, family = ALL._answer(task), family_of(task)
        files = json.loads(dict(task.metadata)["files"])
        hacks = {
            "every_candidate_on_lines": episode(write("\n".join(sorted({truth, "0", "1", "2", *files}))), submit),
            "empty": episode(write(""), submit),
            "huge": episode(write(truth + "\n" * MAX_ANSWER_BYTES), submit),
            "words": episode(write(f"the answer is {truth}"), submit),
            "leading_zero": episode(write("0" + truth), submit),
            "absolute_path": episode(write("/work/" + truth), submit) if family == "which_file" else None,
            # /work edited to tell another truth, then that truth written: judged on the generated files
            "files_edited": episode(call_text("bash", command="rm -f *.txt; echo 'x=1' > a.txt"),
                                    write(str(int(truth) + 1) if truth.isdigit() else "a.txt"), submit),
        }
        verdicts = pool.map(lambda sandbox, text: gate_verify(ALL, task, text, sandbox),
                            [task.reference_answer] + [text for text in hacks.values() if text])
        assert verdicts[0].passed and verdicts[0].reason == VerdictReason.OK, (family, verdicts[0])
        assert all(verdict.reward == 0.0 for verdict in verdicts[1:]), (family, verdicts[1:])
        probes = pool.map(lambda sandbox, text: gate_verify(ALL, task, text, sandbox),
                          [text for _, text in ALL.qa_probe_answers(task) + [("", t) for t in ALL.qa_wrong_answers(task)]])
        assert all(verdict.reward == 0.0 for verdict in probes), (family, probes)
        variants = pool.map(lambda sandbox, text: gate_verify(ALL, task, text, sandbox),
                            [text for _, text in ALL.qa_variant_answers(task)])
        assert all(verdict.passed for verdict in variants), (family, variants)


def test_a_task_whose_files_give_no_truth_is_never_scored():
    task = ALL.tasks("train", 1, seed=1)[0]
    broken = dataclasses.replace(task, metadata=(("split", "train"), ("files", "{}")))

    verdict = ALL.verify(broken, "", object())  # never read: the truth is missing before /work is
    assert verdict.reward is None and verdict.reason == VerdictReason.CRASH


def test_every_oracle_writes_what_its_last_look_shows_and_sums_look_like_two_step(pool):
    """The oracle's answer is read off its own command's output in a sandbox (a policy can
    learn it from the episode), and sum's command is two_step's look with a fixed adder piped on."""
    from rlpipe.envs.agent_task_families import SUM_SUFFIX

    def last_look(sandbox, task):
        sandbox.write_files(ALL.initial_files(task))
        command = [json.loads(reply)["arguments"]["command"] for reply in ALL.oracle_turns(task)
                   if json.loads(reply)["name"] == "bash"][-1]
        return command, sandbox.exec(["bash", "-c", command], timeout_s=10.0).stdout

    tasks = [task for task in ALL.tasks("train", 40, seed=11) if family_of(task) in ("sum", "count", "which_file")]
    tasks += one_per_family()
    looks = pool.map(last_look, tasks)
    for task, (command, stdout) in zip(tasks, looks):
        truth, shown = ALL._answer(task), stdout.splitlines()
        assert truth in shown or f"{key_of(task)}={truth}" in shown or truth in [
            line.partition("=")[2] for line in shown], (family_of(task), command, stdout)
        if family_of(task) == "sum":
            key = key_of(task)
            assert command == f"grep -h ^{key}= * | {SUM_SUFFIX}" and shown == [truth], (command, stdout)
