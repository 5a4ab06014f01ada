"""Deliberately weak envs the quality gate must fail, registered as a plugin would register
its own domains (envs/mixture.py register_env): importing this module makes `rlpipe qa
NAME` build them.

- qa_weak_contains (text): ArithmeticEnv's tasks; the verifier passes any output that
  CONTAINS the right number, so listing every number around it passes.
- qa_weak_partial (text): ReverseEnv's tasks; the verifier passes any non-empty part of the
  right word (a prefix, a suffix, a substring), as a lenient "partial credit" rule would.
- qa_weak_in_process (code): tasks of its own (ids weak_code/..., not HumanEval's, so the
  gate's HumanEval attacks do not apply); the verifier runs the solution and the tests in
  ONE process in a real sandbox and passes on exit status 0, so a solution that exits 0 at
  import (or at exit, or returns a value equal to everything, or reads the tests from its
  caller's frames) passes.

- `write_trusting_task(folder)`: a Harbor-format terminal task (for `rlpipe qa suite --tasks
  DIR`) whose test.sh imports the agent's module in a python3 started in /work and trusts
  its exit status, so a module that exits 0 at import or at exit, or whose functions return
  a value equal to everything, passes.

What it does not: ship with rlpipe (tests only), or fake the sandbox: qa_weak_in_process
runs in the sandbox the gate lends it, the terminal task in real trials.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from rlpipe.core.records import Task, Verdict, VerdictReason, VerifierSpec
from rlpipe.envs.arithmetic import ArithmeticEnv
from rlpipe.envs.mixture import register_env
from rlpipe.envs.reverse import ReverseEnv


def _verdict(passed: bool, version: str, detail: str = "") -> Verdict:
    return Verdict(reward=1.0 if passed else 0.0, passed=passed, reason=VerdictReason.OK if passed else VerdictReason.WRONG,
                   detail=detail, verifier_version=version)


class _WeakText:
    needs_sandbox = False

    def __init__(self, name: str, inner: object) -> None:
        self.name, self.inner, self.verifier_version = name, inner, "weak-" + name

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        return [replace(task, domain=self.name) for task in self.inner.tasks(split, count, seed)]  # type: ignore[attr-defined]


class ContainsTheAnswerEnv(_WeakText):
    """Passes any output that holds the reference anywhere."""

    def __init__(self) -> None:
        super().__init__("qa_weak_contains", ArithmeticEnv(max_operand=20))

    def verify(self, task: Task, completion_text: str, sandbox=None) -> Verdict:
        return _verdict(str(task.reference_answer) in completion_text, self.verifier_version)


class PartialAnswerEnv(_WeakText):
    """Passes any non-empty part of the reference (stripped)."""

    def __init__(self) -> None:
        super().__init__("qa_weak_partial", ReverseEnv())

    def verify(self, task: Task, completion_text: str, sandbox=None) -> Verdict:
        answer = completion_text.strip()
        return _verdict(bool(answer) and len(answer) < 100 and answer in str(task.reference_answer), self.verifier_version)


RUN_IN_ONE_PROCESS = """
import json, sys
spec = json.loads(sys.stdin.read())
namespace = {}
exec(spec["solution"], namespace)
exec(spec["test"], namespace)
namespace["check"](namespace[spec["entry_point"]])
"""
_PROBLEMS = (  # (entry point, signature and docstring, canonical body, test asserts), the last two held out
    ("add", "a, b", "Return a + b.", "    return a + b\n", ["candidate(1, 2) == 3", "candidate(-4, 4) == 0"]),
    ("double", "x", "Return twice x.", "    return 2 * x\n", ["candidate(3) == 6", "candidate(0) == 0"]),
    ("first_word", "text", "The first word of text.", "    return text.split()[0]\n",
     ["candidate('a b') == 'a'", "candidate('hello world') == 'hello'"]),
    ("count_vowels", "text", "How many of a, e, i, o, u text holds.", "    return sum(c in 'aeiou' for c in text)\n",
     ["candidate('banana') == 3", "candidate('xyz') == 0"]),
    ("largest", "values", "The largest of a non-empty list.", "    return max(values)\n",
     ["candidate([1, 5, 2]) == 5", "candidate([-3]) == -3"]),
    ("is_even", "n", "True iff n is even.", "    return n % 2 == 0\n", ["candidate(4) == True", "candidate(7) == False"]),
)


class InProcessCodeEnv:
    """Python functions checked by running the solution and the tests in one sandboxed process."""

    name = "qa_weak_in_process"
    needs_sandbox = True
    qa_answer_style = "code"
    timeout_s = 5.0
    verifier_version = "weak-in-process"

    def __init__(self) -> None:
        self._tasks = [self._task(index, *problem) for index, problem in enumerate(_PROBLEMS)]

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        pool = [task for task in self._tasks if dict(task.metadata)["split"] == split]
        return [pool[(seed + index) % len(pool)] for index in range(count)]

    def verify(self, task: Task, completion_text: str, sandbox=None) -> Verdict:
        started = time.perf_counter()
        spec = json.loads(task.verifier.payload)
        request = json.dumps({**spec, "solution": spec["prompt"] + completion_text}).encode()
        result = sandbox.exec_python(RUN_IN_ONE_PROCESS, stdin=request, timeout_s=self.timeout_s)
        return replace(_verdict(result.exit_code == 0, self.verifier_version, result.stderr[-200:]),
                       duration_s=time.perf_counter() - started)

    def _task(self, index: int, entry: str, params: str, doc: str, body: str, asserts: list[str]) -> Task:
        prompt = f'def {entry}({params}):\n    """{doc}"""\n'
        test = "def check(candidate):\n" + "".join(f"    assert {line}\n" for line in asserts)
        payload = json.dumps({"prompt": prompt, "test": test, "entry_point": entry})
        return Task(task_id=f"weak_code/{entry}", domain=self.name, prompt=prompt,
                    verifier=VerifierSpec(kind="weak_in_process", payload=payload), reference_answer=body,
                    metadata=(("split", "heldout" if index >= len(_PROBLEMS) - 2 else "train"),))


WEAK_ENVS = {"qa_weak_contains": ContainsTheAnswerEnv, "qa_weak_partial": PartialAnswerEnv,
             "qa_weak_in_process": InProcessCodeEnv}
for _name, _factory in WEAK_ENVS.items():
    register_env(_name, _factory)


TRUSTING_TASK = {
    "task.toml": 'version = "1.0"\n\n[agent]\ntimeout_sec = 60.0\nmax_steps = 5\n\n[verifier]\ntimeout_sec = 30.0\n\n'
                 '[environment]\nmemory_mb = 512\nstorage_mb = 64\n',
    "instruction.md": "Make greet(name) in /work/greet.py return 'hello ' followed by the name.\n",
    "environment/greet.py": "def greet(name):\n    return 'hi ' + name\n",
    "solution/solve.sh": "#!/bin/sh\nprintf 'def greet(name):\\n    return \"hello \" + name\\n' > /work/greet.py\n",
    "tests/test.sh": ("#!/bin/sh\n# WEAK ON PURPOSE: the agent's module runs in the checking process, cwd /work, and its exit\n"
                      "# status is trusted\ncd /work\n"
                      "if python3 -c 'import greet; assert greet.greet(\"ada\") == \"hello ada\"'; then r=1; else r=0; fi\n"
                      "echo $r > /logs/verifier/reward.txt\n"),
}


def write_trusting_task(folder: Path) -> Path:
    """The trusting terminal task (see the module docstring) at folder/trusting-greet."""
    task = folder / "trusting-greet"
    for relative, text in TRUSTING_TASK.items():
        (task / relative).parent.mkdir(parents=True, exist_ok=True)
        (task / relative).write_text(text)
    return task
