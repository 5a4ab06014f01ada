"""The agent_tasks domain: small procedurally generated terminal tasks, one multi-turn
episode each (agents/episodes.py runs them in the run's sandbox pool).

A task: /work holds 2..max_files files of `key=value` lines (keys from KEYS, values of
value_digits digits, drawn uniformly for every line whatever its key); exactly one line in one
file has the task's key. The instruction asks for that key's value in the file `ans`, then
`submit`:

    prompt:  "put the value of port in ans, then submit\n"
    oracle:  {"name":"bash","arguments":{"command":"grep -h port *"}}      -> out: port=4
             {"arguments":{"content":"4","path":"ans"},"name":"write_file"} -> out: ok
             {"name":"submit","arguments":{}}

Every other line is a distractor (another key, another value). The verifier reads /work/ans
after the episode: reward 1 iff its stripped content is the value. The skill is the episode:
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
import string
import sys
import time

from rlpipe.core.records import Task, Verdict, VerdictReason, VerifierSpec
from rlpipe.envs import exact
from rlpipe.envs.exact import check_split, in_heldout, source_version
from rlpipe.sandbox.base import Sandbox

AGENT_STATE_KIND = "agent_final_state"
MAX_ANSWER_BYTES = 1000  # the verifier reads no more: a value is at most 9 digits
KEYS = ("port", "user", "code", "size", "host", "mode", "path", "rate")
ANSWER_PATH = "ans"


def call_text(name: str, **arguments: str) -> str:
    """A tool call as the oracle writes it (agents/tools.py's JSON format)."""
    return json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))


def _write(content: str, path: str = ANSWER_PATH) -> str:
    return call_text("write_file", path=path, content=content)


def _bash(command: str) -> str:
    return call_text("bash", command=command)


class AgentTasksEnv:
    """Find a key's value among distractor files, write it to `ans`, submit."""

    name = "agent_tasks"
    needs_sandbox = True
    multi_turn = True

    def __init__(self, max_files: int = 3, lines_per_file: int = 2, max_turns: int = 4, value_digits: int = 1,
                 heldout_fraction: float = 0.2) -> None:
        if not 2 <= max_files <= 26 or lines_per_file < 1:
            raise ValueError(f"need 2 <= max_files <= 26 and lines_per_file >= 1, got {max_files}, {lines_per_file}")
        if max_turns < 3:
            raise ValueError(f"the oracle needs 3 turns; max_turns must be >= 3, got {max_turns}")
        if not 0 < heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        if not 1 <= value_digits <= 9:
            raise ValueError(f"value_digits must be in 1..9, got {value_digits}")
        self.value_digits = value_digits
        self.max_files, self.lines_per_file, self.max_turns = max_files, lines_per_file, max_turns
        self.heldout_fraction = heldout_fraction
        self.verifier_version = source_version(
            (exact, sys.modules[__name__]),
            (("max_files", max_files), ("lines_per_file", lines_per_file), ("max_turns", max_turns), ("value_digits", value_digits),
             ("heldout_fraction", heldout_fraction)))

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
            task = self._task(rng, rng.choice(KEYS), self._value(rng), split)
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

    def verify(self, task: Task, completion_text: str, sandbox: Sandbox | None = None) -> Verdict:
        """Judge the final /work in `sandbox` (see the module docstring)."""
        started = time.perf_counter()

        def verdict(reward: float | None, reason: VerdictReason, detail: str) -> Verdict:
            return Verdict(reward, reward == 1.0, reason, detail, time.perf_counter() - started, self.verifier_version)

        if sandbox is None:
            return verdict(None, VerdictReason.SANDBOX_ERROR, "agent_tasks judges the episode's final state; no sandbox given")
        expected = self._answer(task)
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
        """The value written with whitespace around it: the verifier strips it, so these pass."""
        grep, _, submit = self.oracle_turns(task)
        value = self._answer(task)
        return [("surrounding_whitespace", json.dumps([grep, _write(f"  {value} \n\n"), submit])),
                ("trailing_newline_no_look", json.dumps([_write(value + "\n"), submit]))]

    def qa_wrong_answers(self, task: Task) -> list[str]:
        """Another digit written; nothing written."""
        grep, _, submit = self.oracle_turns(task)
        value = self._answer(task)
        other = "".join(str((int(digit) + 1) % 10) for digit in value)
        return [json.dumps([grep, _write(other), submit]), json.dumps([grep, submit])]

    def qa_probe_answers(self, task: Task) -> list[tuple[str, str]]:
        """Episodes that must score 0: submitting at once, saying nothing, the prompt, the tool's
        whole output line, every digit (in a line, on lines), every file, the value padded
        past the read bound, the value in another file, and an `ans` that is not a regular
        file (a symlink to the file that holds the value, one out of /work, a folder)."""
        grep, _, submit = self.oracle_turns(task)
        key, value = task.prompt.split()[4], self._answer(task)
        files = json.loads(dict(task.metadata)["files"])
        home = next(name for name, content in sorted(files.items()) if f"{key}={value}" in content.splitlines())

        scripts = {
            "submit_at_once": [submit],
            "empty_reply": [""],
            "prompt_written": [_write(task.prompt), submit],
            "tool_output_line": [grep, _bash(f"grep -h {key} * > {ANSWER_PATH}"), submit],
            "every_digit": [grep, _write("0123456789"), submit],
            "every_digit_on_lines": [grep, _write("\n".join("0123456789")), submit],
            "every_file": [_bash(f"cat * > {ANSWER_PATH}"), submit],
            "value_padded_past_the_bound": [grep, _write(value + " " * (MAX_ANSWER_BYTES + 1)), submit],
            "value_in_another_file": [grep, _write(value, path="answer"), submit],
            "symlink_to_the_value_file": [_bash(f"ln -s {home} {ANSWER_PATH}"), submit],
            "symlink_out_of_work": [_bash(f"ln -s /proc/self/cmdline {ANSWER_PATH}"), submit],
            "ans_a_folder": [_bash(f"mkdir {ANSWER_PATH}"), submit],
        }
        return [(name, json.dumps(script)) for name, script in scripts.items()]

    @staticmethod
    def _answer(task: Task) -> str:
        return json.loads(task.verifier.payload)["value"]

    def _value(self, rng: random.Random) -> str:
        return f"{rng.randrange(10 ** self.value_digits):0{self.value_digits}d}"

    def _task(self, rng: random.Random, key: str, value: str, split: str) -> Task:
        file_count = rng.randint(2, self.max_files)
        names = [f"{letter}.txt" for letter in rng.sample(string.ascii_lowercase, file_count)]
        lines: dict[str, list[str]] = {name: [] for name in names}
        for name in names:
            for _ in range(rng.randint(1, self.lines_per_file)):
                other = rng.choice([candidate for candidate in KEYS if candidate != key])
                lines[name].append(f"{other}={self._value(rng)}")
        home = rng.choice(names)
        lines[home].insert(rng.randint(0, len(lines[home])), f"{key}={value}")
        files = {name: "\n".join(file_lines) + "\n" for name, file_lines in lines.items()}
        # the write call's arguments first, content first: the value it copies from the tool's
        # output is then 26 characters back, which a tiny model learns to attend to sooner
        write = json.dumps({"arguments": {"content": value, "path": ANSWER_PATH}, "name": "write_file"}, separators=(",", ":"))
        oracle = [call_text("bash", command=f"grep -h {key} *"),
                  write,
                  call_text("submit")]
        files_json = json.dumps(files, sort_keys=True)
        return Task(
            task_id=f"{self.name}/{key}-{hashlib.sha256(files_json.encode()).hexdigest()[:8]}",
            domain=self.name,
            prompt=f"put the value of {key} in {ANSWER_PATH}, then submit\n",
            verifier=VerifierSpec(kind=AGENT_STATE_KIND, payload=json.dumps({"path": ANSWER_PATH, "value": value})),
            reference_answer=json.dumps(oracle),
            metadata=(("split", split), ("files", files_json)),
        )

