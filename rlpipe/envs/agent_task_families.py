"""The task families of the agent_tasks domain: how each one lays out /work, asks its
question, solves it (the oracle's tool calls) and computes its truth from the generated files.

Every family works on files of `key=value` lines (keys from KEYS, values of `digits` digits
drawn uniformly whatever the key) and asks for one answer in the file `ans`:

- lookup     "put the value of K in ans": one line has K (the agent quickstart's family; its
             draws and oracle are unchanged: grep, write the value, submit)
- count      "put the number of lines with key K in ans": K on 1..4 lines across the files;
             oracle `cat * | grep -c ^K=`
- sum        "put the sum of the values of K in ans": K on 2..3 lines, its values never 0
             (a 0 would make the sum equal another value: copying one would pass); oracle
             `grep -h ^K= * | awk -F= '{s+=$2} END{print s}'` (K's lines, then a fixed adder)
- which_file "put the name of the file that has key K in ans": K on one line; oracle `grep -l`
- two_step   "put the value of the key that pick names in ans": one line `pick=K2`, one line
             `K2=v`; the second command's key is only in the first command's output, so the
             oracle takes two looks (4 replies)

`truth(files, key)` is computed from the files as generated (the task's metadata), never from
/work at the end of an episode: an agent that edits or deletes the files changes nothing the
verifier compares against. `candidates(files, key)` are answers a guesser could try (every
digit, every count, every file name, every value): the quality gate writes them all at once
and must see 0.

What it does not: verify (envs/agent_tasks.py), split tasks, or run episodes.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass

KEYS = ("port", "user", "code", "size", "host", "mode", "path", "rate")
ANSWER_PATH = "ans"
POINTER_KEY = "pick"  # two_step's pointer line: pick=<another key>
FAMILIES = ("lookup", "count", "sum", "which_file", "two_step")
# sum's oracle pipes the lines of K (the same look as two_step's `grep -h ^K= *`) into this
# fixed adder: the key-dependent part of the command is one the other families teach, and
# what tells sum apart is a suffix without the key, one choice after `*` that a warm start
# and RL can learn from the question's words.
SUM_SUFFIX = "awk -F= '{s+=$2} END{print s}'"


def call_text(name: str, **arguments: str) -> str:
    """A tool call as the oracle writes it (agents/tools.py's JSON format)."""
    return json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))


def write_call(content: str, path: str = ANSWER_PATH) -> str:
    """write_file with its arguments first, content first: the value it copies from the tool's
    output is then 26 characters back, which a tiny model learns to attend to sooner."""
    return json.dumps({"arguments": {"content": content, "path": path}, "name": "write_file"}, separators=(",", ":"))


@dataclass(frozen=True)
class Generated:
    """One drawn task: its files, its key, the question and the oracle's replies."""

    files: dict[str, str]
    key: str
    question: str
    oracle: list[str]


def parse_lines(files: dict[str, str]) -> list[tuple[str, str, str]]:
    """(file name, key, value) of every `key=value` line, files in name order."""
    found = []
    for name in sorted(files):
        for line in files[name].splitlines():
            key, sep, value = line.partition("=")
            if sep:
                found.append((name, key, value))
    return found


class _Draw:
    """The shared drawing of files: names, distractor lines, and lines placed at random."""

    def __init__(self, rng: random.Random, max_files: int, lines_per_file: int, digits: int) -> None:
        self.rng, self.digits = rng, digits
        names = [f"{letter}.txt" for letter in rng.sample(string.ascii_lowercase, rng.randint(2, max_files))]
        self.lines: dict[str, list[str]] = {name: [] for name in names}
        self.lines_per_file = lines_per_file

    def value(self, nonzero: bool = False) -> str:
        return f"{self.rng.randrange(1 if nonzero else 0, 10 ** self.digits):0{self.digits}d}"

    def distractors(self, *avoid: str) -> None:
        for name in self.lines:
            for _ in range(self.rng.randint(1, self.lines_per_file)):
                other = self.rng.choice([candidate for candidate in KEYS if candidate not in avoid])
                self.lines[name].append(f"{other}={self.value()}")

    def place(self, line: str) -> str:
        """Insert `line` at a random place of a random file; the file's name."""
        home = self.rng.choice(list(self.lines))
        self.lines[home].insert(self.rng.randint(0, len(self.lines[home])), line)
        return home

    def files(self) -> dict[str, str]:
        return {name: "\n".join(file_lines) + "\n" for name, file_lines in self.lines.items()}


def _lookup(rng: random.Random, max_files: int, lines_per_file: int, digits: int) -> Generated:
    key = rng.choice(KEYS)
    value = f"{rng.randrange(10 ** digits):0{digits}d}"  # the agent quickstart's draw order: key, value, files
    draw = _Draw(rng, max_files, lines_per_file, digits)
    draw.distractors(key)
    draw.place(f"{key}={value}")
    return Generated(draw.files(), key, f"put the value of {key} in {ANSWER_PATH}, then submit",
                     [call_text("bash", command=f"grep -h {key} *"), write_call(value), call_text("submit")])


def _key_on_lines(rng: random.Random, max_files: int, lines_per_file: int, digits: int, fewest: int,
                  most: int, nonzero: bool = False) -> tuple[str, dict[str, str]]:
    """A key drawn, distractor files, then the key on fewest..most lines with drawn values
    (never 0 with `nonzero`)."""
    key = rng.choice(KEYS)
    draw = _Draw(rng, max_files, lines_per_file, digits)
    draw.distractors(key)
    for _ in range(rng.randint(fewest, most)):
        draw.place(f"{key}={draw.value(nonzero)}")
    return key, draw.files()


def _count(rng: random.Random, max_files: int, lines_per_file: int, digits: int) -> Generated:
    key, files = _key_on_lines(rng, max_files, lines_per_file, digits, 1, 4)
    return Generated(files, key, f"put the number of lines with key {key} in {ANSWER_PATH}, then submit",
                     [call_text("bash", command=f"cat * | grep -c ^{key}="), write_call(_count_truth(files, key)),
                      call_text("submit")])


def _sum(rng: random.Random, max_files: int, lines_per_file: int, digits: int) -> Generated:
    key, files = _key_on_lines(rng, max_files, lines_per_file, digits, 2, 3, nonzero=True)
    command = f"grep -h ^{key}= * | {SUM_SUFFIX}"
    return Generated(files, key, f"put the sum of the values of {key} in {ANSWER_PATH}, then submit",
                     [call_text("bash", command=command), write_call(_sum_truth(files, key)), call_text("submit")])


def _which_file(rng: random.Random, max_files: int, lines_per_file: int, digits: int) -> Generated:
    key = rng.choice(KEYS)
    draw = _Draw(rng, max_files, lines_per_file, digits)
    draw.distractors(key)
    home = draw.place(f"{key}={draw.value()}")
    return Generated(draw.files(), key, f"put the name of the file that has key {key} in {ANSWER_PATH}, then submit",
                     [call_text("bash", command=f"grep -l ^{key}= *"), write_call(home), call_text("submit")])


def _two_step(rng: random.Random, max_files: int, lines_per_file: int, digits: int) -> Generated:
    target = rng.choice(KEYS)
    draw = _Draw(rng, max_files, lines_per_file, digits)
    draw.distractors(target)
    draw.place(f"{POINTER_KEY}={target}")
    value = draw.value()
    draw.place(f"{target}={value}")
    return Generated(draw.files(), POINTER_KEY,
                     f"put the value of the key that {POINTER_KEY} names in {ANSWER_PATH}, then submit",
                     [call_text("bash", command=f"grep -h ^{POINTER_KEY}= *"), call_text("bash", command=f"grep -h ^{target}= *"),
                      write_call(value), call_text("submit")])


def _lookup_truth(files: dict[str, str], key: str) -> str:
    (value,) = [value for _, line_key, value in parse_lines(files) if line_key == key]
    return value


def _count_truth(files: dict[str, str], key: str) -> str:
    return str(sum(1 for _, line_key, _ in parse_lines(files) if line_key == key))


def _sum_truth(files: dict[str, str], key: str) -> str:
    return str(sum(int(value) for _, line_key, value in parse_lines(files) if line_key == key))


def _which_file_truth(files: dict[str, str], key: str) -> str:
    (home,) = [name for name, line_key, _ in parse_lines(files) if line_key == key]
    return home


def _two_step_truth(files: dict[str, str], key: str) -> str:
    return _lookup_truth(files, _lookup_truth(files, key))


def _every_value(files: dict[str, str], key: str) -> list[str]:
    values = {value for _, _, value in parse_lines(files)} | {str(digit) for digit in range(10)}
    return sorted(values)


def _every_count(files: dict[str, str], key: str) -> list[str]:
    return [str(count) for count in range(len(parse_lines(files)) + 1)]


def _every_partial_sum(files: dict[str, str], key: str) -> list[str]:
    values = [int(value) for _, line_key, value in parse_lines(files) if line_key == key]
    partial = {sum(values[:end]) for end in range(len(values) + 1)} | set(values)
    return sorted({str(total + delta) for total in partial for delta in (-1, 0, 1)})


def _every_file(files: dict[str, str], key: str) -> list[str]:
    return sorted(files)


@dataclass(frozen=True)
class Family:
    """How one family draws a task, computes its truth and lists guessable answers."""

    draw: Callable[[random.Random, int, int, int], Generated]
    truth: Callable[[dict[str, str], str], str]
    candidates: Callable[[dict[str, str], str], list[str]]


FAMILY = {
    "lookup": Family(_lookup, _lookup_truth, _every_value),
    "count": Family(_count, _count_truth, _every_count),
    "sum": Family(_sum, _sum_truth, _every_partial_sum),
    "which_file": Family(_which_file, _which_file_truth, _every_file),
    "two_step": Family(_two_step, _two_step_truth, _every_value),
}
