"""The agent_tasks domain: small procedurally generated terminal tasks, one multi-turn
episode each (agents/episodes.py runs them in the run's sandbox pool).

Families (`agent_families`, envs/agent_task_families.py; default ("lookup",), the agent
quickstart's one, whose tasks, ids and oracle are as below and unchanged): lookup, count,
sum, which_file, two_step; each asks for one answer in `ans`, and the verifier compares it
with the truth computed from the files AS GENERATED (the task's metadata), never from /work
after the episode. With several families a task's family is drawn first (seeded); max_turns
defaults to the longest oracle + 1 (4; 5 with two_step).

The lookup task: /work holds 2..max_files files of `key=value` lines (keys from KEYS, values of
value_digits digits, drawn uniformly for every line whatever its key); exactly one line in one
file has the task's key. The instruction asks for that key's value in the file `ans`, then
`submit`:

    prompt:  "put the value of port in ans, then submit\n"
    oracle:  {"name":"bash","arguments":{"command":"grep -h port *"}}      -> out: port=4
             {"arguments":{"content":"4","path":"ans"},"name":"write_file"} -> out: ok
             {"name":"submit","arguments":{}}

Every other line is a distractor (another key, another value). The verifier reads /work/ans
after the episode: reward 1 iff its stripped content is the truth. The skill is the episode:
look, read the value from the tool's output, write it, submit; a tiny model learns the
value's copy from the observation, which it cannot know from the prompt: the value is
uniform and independent of the key, so no reply that ignores the tool's output beats chance
(1 in 10**value_digits). Train and held-out tasks are disjoint: a task belongs to one split by
a hash of its files (envs/exact.py's `in_heldout`), so no held-out task is ever seen in
training, whatever the seeds. (The split is not by answer: with one digit the ten answers
recur in both splits; an earlier split by (key, value) let a model score on training tasks
from which values answer each key there, and 0 on held-out, without ever reading the value.)

A multi-turn env (`multi_turn = True`) gives, beyond the Env protocol: `initial_files(task)`
(written to /work before the first turn), `oracle_turns(task)` (the reference replies, for
the warm-start's oracle episodes) and `max_turns`. Its `verify(task, text, sandbox)` judges
the FINAL STATE in `sandbox`, which must hold the episode's /work (the episode runner calls
it in the episode's own sandbox); the text is not read. Without a sandbox it returns a
sandbox_error verdict (reward None: never scored).

What it does not: run episodes, parse tool calls, or talk to a model (agents/episodes.py).
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from collections.abc import Sequence

from rlpipe.core.records import Task, Verdict, VerdictReason, VerifierSpec
from rlpipe.envs import agent_task_families, exact
from rlpipe.envs.agent_task_families import ANSWER_PATH, FAMILIES, FAMILY, KEYS, call_text
from rlpipe.envs.exact import check_split, in_heldout, source_version
from rlpipe.sandbox.base import Sandbox

__all__ = ["AGENT_STATE_KIND", "ANSWER_PATH", "FAMILIES", "KEYS", "MAX_ANSWER_BYTES", "AgentTasksEnv", "call_text"]

AGENT_STATE_KIND = "agent_final_state"
MAX_ANSWER_BYTES = 1000  # the verifier reads no more: an answer is a few characters


def _write(content: str, path: str = ANSWER_PATH) -> str:
    return call_text("write_file", path=path, content=content)


def _bash(command: str) -> str:
    return call_text("bash", command=command)


class AgentTasksEnv:
    """Find a key's value among distractor files, write it to `ans`, submit."""

    name = "agent_tasks"
    needs_sandbox = True
    multi_turn = True

    def __init__(self, max_files: int = 3, lines_per_file: int = 2, max_turns: int | None = None, value_digits: int = 1,
                 heldout_fraction: float = 0.2, agent_families: Sequence[str] = ("lookup",)) -> None:
        if not 2 <= max_files <= 26 or lines_per_file < 1:
            raise ValueError(f"need 2 <= max_files <= 26 and lines_per_file >= 1, got {max_files}, {lines_per_file}")
        unknown = sorted(set(agent_families) - set(FAMILIES))
        if unknown or not agent_families or len(set(agent_families)) != len(agent_families):
            raise ValueError(f"agent_families must name distinct families of {list(FAMILIES)}, got {list(agent_families)}")
        self.families = tuple(agent_families)
        oracle_turns = 4 if "two_step" in self.families else 3
        max_turns = oracle_turns + 1 if max_turns is None else max_turns
        if max_turns < oracle_turns:
            raise ValueError(f"the oracle needs {oracle_turns} turns; max_turns must be >= {oracle_turns}, got {max_turns}")
        if not 0 < heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        if not 1 <= value_digits <= 9:
            raise ValueError(f"value_digits must be in 1..9, got {value_digits}")
        self.value_digits = value_digits
        self.max_files, self.lines_per_file, self.max_turns = max_files, lines_per_file, max_turns
        self.heldout_fraction = heldout_fraction
        params: tuple[tuple[str, object], ...] = (
            ("max_files", max_files), ("lines_per_file", lines_per_file), ("max_turns", max_turns), ("value_digits", value_digits),
            ("heldout_fraction", heldout_fraction))
        if self.families != ("lookup",):
            params += (("families", self.families),)
        self.verifier_version = source_version((exact, agent_task_families, sys.modules[__name__]), params)

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        """`count` distinct tasks of the split (while the task space allows), seeded."""
        check_split(split)
        rng = random.Random(f"{self.name}:{split}:{seed}")
        want_heldout = split == "heldout"
        seen: set[str] = set()
        tasks: list[Task] = []
        attempts = 0
        while len(tasks) < count:
            attempts += 1
            family = self.families[0] if len(self.families) == 1 else rng.choice(self.families)
            task = self._task(rng, family, split)
            files = dict(task.metadata)["files"]
            if in_heldout(files, self.heldout_fraction) != want_heldout:
                continue
            if files in seen and attempts < 100 * (count + 10):
                continue
            seen.add(files)
            tasks.append(task)
        return tasks

    def initial_files(self, task: Task) -> dict[str, bytes]:
        """The files of /work before the first turn."""
        return {path: content.encode() for path, content in json.loads(dict(task.metadata)["files"]).items()}

    def oracle_turns(self, task: Task) -> list[str]:
        """The reference replies, in order (each one tool call)."""
        return list(json.loads(task.reference_answer or "[]"))

    def task_family(self, task: Task) -> str:
        """The task's family (lookup for a task without one in its payload: the quickstart's);
        a held-out evaluation reports its figures per family (controller/evaluation.py)."""
        return self._family(task)

    def verify(self, task: Task, completion_text: str, sandbox: Sandbox | None = None) -> Verdict:
        """Judge the final /work in `sandbox` (see the module docstring)."""
        started = time.perf_counter()

        def verdict(reward: float | None, reason: VerdictReason, detail: str) -> Verdict:
            return Verdict(reward, reward == 1.0, reason, detail, time.perf_counter() - started, self.verifier_version)

        if sandbox is None:
            return verdict(None, VerdictReason.SANDBOX_ERROR, "agent_tasks judges the episode's final state; no sandbox given")
        try:
            expected = self._answer(task)
        except (KeyError, ValueError) as exc:  # a task not made by this env
            return verdict(None, VerdictReason.CRASH, f"the task's files give no truth: {type(exc).__name__}: {exc}")
        try:
            raw = sandbox.read_file(ANSWER_PATH)
        except (OSError, ValueError, RuntimeError) as exc:  # no ans (or not a regular file)
            return verdict(0.0, VerdictReason.WRONG, f"no readable /work/{ANSWER_PATH}: {type(exc).__name__}")
        if len(raw) > MAX_ANSWER_BYTES:
            return verdict(0.0, VerdictReason.WRONG, f"/work/{ANSWER_PATH} holds {len(raw)} bytes; an answer is at most {MAX_ANSWER_BYTES}")
        written = raw.decode("utf-8", errors="replace")
        if written.strip() == expected:
            return verdict(1.0, VerdictReason.OK, "")
        return verdict(0.0, VerdictReason.WRONG, f"/work/{ANSWER_PATH} holds {written.strip()[:40]!r}")

    # The quality gate (rlpipe qa; qa/answers.py): each answer is a scripted episode, a JSON
    # list of replies (controller/agent_episodes.py gate_verify plays it in a sandbox).

    def qa_variant_answers(self, task: Task) -> list[tuple[str, str]]:
        """The answer written with whitespace around it: the verifier strips it, so these pass."""
        *look, _, submit = self.oracle_turns(task)
        value = self._answer(task)
        return [("surrounding_whitespace", json.dumps([*look, _write(f"  {value} \n\n"), submit])),
                ("trailing_newline_no_look", json.dumps([_write(value + "\n"), submit]))]

    def qa_wrong_answers(self, task: Task) -> list[str]:
        """Another answer written (each digit moved by one; another file); nothing written."""
        *look, _, submit = self.oracle_turns(task)
        value = self._answer(task)
        if value.isdigit():
            other = "".join(str((int(digit) + 1) % 10) for digit in value)
        else:
            other = next(name for name in sorted(self._files(task)) if name != value)
        return [json.dumps([*look, _write(other), submit]), json.dumps([*look, submit])]

    def qa_probe_answers(self, task: Task) -> list[tuple[str, str]]:
        """Episodes that must score 0: submitting at once, saying nothing, the prompt, the tool's
        whole output line, every digit and every candidate answer (in a line, on lines), every
        file, the answer in words, the answer padded past the read bound, the answer in another
        file, and an `ans` that is not a regular file (a symlink to the file that holds the
        key, one out of /work, a folder); for count, the files deleted and 0 written."""
        *look, _, submit = self.oracle_turns(task)
        key, value, files = self._key(task), self._answer(task), self._files(task)
        home = next((name for name, content in sorted(files.items())
                     if any(line.partition("=")[0] == key for line in content.splitlines())), sorted(files)[0])
        candidates = FAMILY[self._family(task)].candidates(files, key)
        scripts = {
            "submit_at_once": [submit],
            "empty_reply": [""],
            "prompt_written": [_write(task.prompt), submit],
            "tool_output_line": [*look, _bash(f"grep -h {key} * > {ANSWER_PATH}"), submit],
            "every_digit": [*look, _write("0123456789"), submit],
            "every_digit_on_lines": [*look, _write("\n".join("0123456789")), submit],
            "every_candidate": [*look, _write(" ".join(candidates)), submit],
            "every_candidate_on_lines": [*look, _write("\n".join(candidates)), submit],
            "every_file": [_bash(f"cat * > {ANSWER_PATH}"), submit],
            "answer_in_words": [*look, _write(f"{value} is the answer"), submit],
            "value_padded_past_the_bound": [*look, _write(value + " " * (MAX_ANSWER_BYTES + 1)), submit],
            "value_in_another_file": [*look, _write(value, path="answer"), submit],
            "symlink_to_the_value_file": [_bash(f"ln -s {home} {ANSWER_PATH}"), submit],
            "symlink_out_of_work": [_bash(f"ln -s /proc/self/cmdline {ANSWER_PATH}"), submit],
            "ans_a_folder": [_bash(f"mkdir {ANSWER_PATH}"), submit],
        }
        if self._family(task) == "count":  # the truth is >= 1 and read from the generated files
            scripts["files_deleted_then_zero"] = [_bash("rm -f *.txt"), _write("0"), submit]
        return [(name, json.dumps(script)) for name, script in scripts.items()]

    @staticmethod
    def _files(task: Task) -> dict[str, str]:
        return json.loads(dict(task.metadata)["files"])

    @staticmethod
    def _family(task: Task) -> str:
        return json.loads(task.verifier.payload).get("family", "lookup")

    @staticmethod
    def _key(task: Task) -> str:
        payload = json.loads(task.verifier.payload)
        return payload["key"] if "key" in payload else task.prompt.split()[4]

    def _answer(self, task: Task) -> str:
        """The truth, computed from the files as generated (not from /work after the episode)."""
        family = self._family(task)
        if family not in FAMILY:
            raise ValueError(f"unknown family {family!r}")
        return FAMILY[family].truth(self._files(task), self._key(task))

    def _task(self, rng: random.Random, family: str, split: str) -> Task:
        drawn = FAMILY[family].draw(rng, self.max_files, self.lines_per_file, self.value_digits)
        files_json = json.dumps(drawn.files, sort_keys=True)
        digest = hashlib.sha256(files_json.encode()).hexdigest()[:8]
        if family == "lookup":  # the agent quickstart's ids and payload, unchanged
            task_id = f"{self.name}/{drawn.key}-{digest}"
            payload = {"path": ANSWER_PATH, "value": FAMILY[family].truth(drawn.files, drawn.key)}
        else:
            task_id = f"{self.name}/{family}-{drawn.key}-{digest}"
            payload = {"path": ANSWER_PATH, "family": family, "key": drawn.key}
        return Task(
            task_id=task_id,
            domain=self.name,
            prompt=drawn.question + "\n",
            verifier=VerifierSpec(kind=AGENT_STATE_KIND, payload=json.dumps(payload)),
            reference_answer=json.dumps(drawn.oracle),
            metadata=(("split", split), ("files", files_json)),
        )
