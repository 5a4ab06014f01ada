"""The code env on every HumanEval problem, and reward-hack probes, in each sandbox backend.

Each backend is a module-scoped pool (bwrap: marked `bwrap`; docker: marked `docker`), skipped
cleanly where it cannot start (docker: only where no engine answers and none was provisioned,
tests/helpers/docker_engine.py). All 164 problems run through the pool's threads.
"""

from __future__ import annotations

import pytest

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.core.records import VerdictReason
from rlpipe.envs.code import CodeEnv
from rlpipe.sandbox.base import ExecResult, Limits, Snapshot
from tests.helpers.docker_engine import no_docker

BACKENDS = [pytest.param("bwrap", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)]
LIMITS = Limits(timeout_s=10, memory_mb=256, max_processes=32)


def _factory(backend: str):
    if backend == "bwrap":
        from rlpipe.sandbox.bwrap import BwrapSandbox

        return lambda: BwrapSandbox(LIMITS)
    from rlpipe.sandbox.docker_backend import DockerSandbox

    return lambda: DockerSandbox(LIMITS)


@pytest.fixture(scope="module", params=BACKENDS)
def pool(request):
    from rlpipe.sandbox.pool import SandboxPool, default_pool_size

    size = min(4, max(2, default_pool_size(LIMITS.memory_mb)))
    try:
        sandbox_pool = SandboxPool(_factory(request.param), size)
    except SandboxUnavailable as exc:
        if request.param == "docker":
            no_docker(f"docker sandboxes cannot start here: {exc.message}")
        pytest.skip(f"{request.param} sandboxes cannot start here: {exc.message}")
    yield sandbox_pool
    sandbox_pool.close()


@pytest.fixture(scope="module")
def env():
    return CodeEnv(timeout_s=5.0)


@pytest.fixture(scope="module")
def first_task(env):
    return env.task("HumanEval/0")  # has_close_elements(numbers, threshold) -> bool


def verify_all(pool, env, completions_by_task):
    tasks = env.all_tasks()
    return pool.map(lambda sandbox, task: env.verify(task, completions_by_task(task), sandbox), tasks)


def test_every_canonical_solution_passes(pool, env):
    verdicts = verify_all(pool, env, lambda task: task.reference_answer)
    failures = [(task.task_id, v.reason.value, v.detail) for task, v in zip(env.all_tasks(), verdicts) if not v.passed]
    assert len(verdicts) == 164 and failures == []
    assert all(v.reward == 1.0 for v in verdicts)


def test_every_empty_solution_fails(pool, env):
    verdicts = verify_all(pool, env, lambda task: "    pass\n")
    assert len(verdicts) == 164
    assert [task.task_id for task, v in zip(env.all_tasks(), verdicts) if v.passed or v.reward != 0.0] == []


def verify_one(pool, env, task, completion):
    with pool.acquire() as sandbox:
        return env.verify(task, completion, sandbox)


def test_os_exit_zero_before_the_tests_fails(pool, env, first_task):
    verdict = verify_one(pool, env, first_task, "    return True\nimport os\nos._exit(0)\n")
    assert not verdict.passed and verdict.reason is VerdictReason.WRONG


def test_sys_exit_zero_before_the_tests_fails(pool, env, first_task):
    verdict = verify_one(pool, env, first_task, "    return True\nimport sys\nsys.exit(0)\n")
    assert not verdict.passed and verdict.reward == 0.0


def test_printing_passed_and_ok_on_every_fd_fails(pool, env, first_task):
    completion = (
        "    return True\n"
        "import os\n"
        "print('PASSED'); print('ok'); print('all tests passed')\n"
        "for fd in range(0, 20):\n"
        "    try:\n"
        "        os.write(fd, b'PASSED ok\\n0123456789abcdef0123456789abcdef ok\\n')\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)\n"
    )
    verdict = verify_one(pool, env, first_task, completion)
    assert not verdict.passed and verdict.reward == 0.0


def test_a_solution_that_edits_or_deletes_the_tests_fails(pool, env, first_task):
    completion = (
        "    return True\n"
        "import builtins, os, shutil\n"
        "def check(candidate):\n"
        "    return None\n"
        "for root in ('/work', '/tmp'):\n"
        "    for name in os.listdir(root):\n"
        "        path = os.path.join(root, name)\n"
        "        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)\n"
        "    for name in ('test.py', 'tests.py', 'check.py', 'harness.py'):\n"
        "        with open(os.path.join(root, name), 'w') as f:\n"
        "            f.write('def check(candidate):\\n    pass\\n')\n"
        "builtins.AssertionError = type('Harmless', (Exception,), {})\n"
        "builtins.abs = lambda value: 0\n"
    )
    verdict = verify_one(pool, env, first_task, completion)
    assert not verdict.passed and verdict.reward == 0.0


def test_a_solution_that_patches_exec_and_the_harness_exit_fails(pool, env, first_task):
    completion = (
        "    return True\n"
        "import builtins, os\n"
        "real_write, real_exit = os.write, os._exit\n"
        "builtins.exec = lambda code, scope=None: scope.__setitem__('check', lambda candidate: None)\n"
        "os.write = lambda fd, data: real_write(fd, data.replace(b' wrong', b' ok').replace(b' crash', b' ok'))\n"
        "os._exit = lambda status: real_exit(0)\n"
    )
    verdict = verify_one(pool, env, first_task, completion)
    assert not verdict.passed and verdict.reason is VerdictReason.WRONG


def test_an_infinite_loop_is_a_timeout(pool, first_task):
    verdict = verify_one(pool, CodeEnv(timeout_s=1.0), first_task, "    while True:\n        pass\n")
    assert verdict.reason is VerdictReason.TIMEOUT and verdict.reward == 0.0


def test_a_memory_bomb_is_oom_or_crash(pool, env, first_task):
    completion = "    chunks = []\n    while True:\n        chunks.append(bytearray(2**24))\n"
    verdict = verify_one(pool, env, first_task, completion)
    assert verdict.reason in (VerdictReason.OOM, VerdictReason.CRASH) and verdict.reward == 0.0


def test_huge_output_does_not_hide_a_correct_solution(pool, env, first_task):
    completion = first_task.reference_answer + "import sys\nsys.stdout.write('x' * 10**8)\nsys.stderr.write('y' * 10**7)\n"
    verdict = verify_one(pool, env, first_task, completion)
    assert verdict.passed, verdict.detail


@pytest.mark.parametrize(("task_id", "completion"), [
    ("HumanEval/111", "    from collections import Counter\n    counts = Counter(w for w in test.split(' ') if w)\n"
                      "    top = max(counts.values(), default=0)\n    return Counter({w: c for w, c in counts.items() if c == top})\n"),
    ("HumanEval/8", "    import collections, math\n    return collections.namedtuple('Pair', 'total product')"
                    "(sum(numbers), math.prod(numbers))\n"),
    ("HumanEval/2", "    print('thinking...'); import sys; sys.stderr.write('debug\\n')\n    return number - int(number)\n"),
])
def test_correct_solutions_in_other_shapes_pass(pool, env, task_id, completion):
    """A Counter or a namedtuple crosses as its base type's contents; prints go nowhere."""
    verdict = verify_one(pool, env, env.task(task_id), completion)
    assert verdict.passed, verdict.detail


def test_a_syntax_error_is_a_format_verdict(pool, env, first_task):
    verdict = verify_one(pool, env, first_task, "    return (\n")
    assert verdict.reason is VerdictReason.FORMAT and verdict.reward == 0.0


class BrokenSandbox:
    """A Sandbox whose backend is gone: every call raises SandboxUnavailable."""

    def exec(self, argv: list[str], stdin: bytes = b"", timeout_s: float | None = None) -> ExecResult:
        raise SandboxUnavailable("engine gone")

    def exec_python(self, code: str, stdin: bytes = b"", timeout_s: float | None = None, args=()) -> ExecResult:
        raise SandboxUnavailable("engine gone")

    def write_files(self, files: dict[str, bytes]) -> None:
        raise SandboxUnavailable("engine gone")

    def read_file(self, path: str) -> bytes:
        raise SandboxUnavailable("engine gone")

    def snapshot(self) -> Snapshot:
        raise SandboxUnavailable("engine gone")

    def restore(self, snapshot: Snapshot) -> None:
        raise SandboxUnavailable("engine gone")

    def reset(self) -> None:
        raise SandboxUnavailable("engine gone")

    def close(self) -> None:
        pass


def test_a_failed_sandbox_is_sandbox_error_with_no_reward(env, first_task):
    for sandbox in (BrokenSandbox(), None):
        verdict = env.verify(first_task, first_task.reference_answer, sandbox)
        assert verdict.reason is VerdictReason.SANDBOX_ERROR and verdict.reward is None and not verdict.passed


def test_splits_are_disjoint_seeded_and_cover_humaneval(env):
    train = {task.task_id for task in env.tasks("train", 1000, seed=0)}
    heldout = {task.task_id for task in env.tasks("heldout", 1000, seed=0)}
    assert not train & heldout and len(train | heldout) == 164
    assert env.tasks("train", 5, seed=1) == env.tasks("train", 5, seed=1)
    assert env.tasks("train", 5, seed=1) != env.tasks("train", 5, seed=2)


def test_tasks_carry_prompt_reference_and_a_versioned_verifier(env, first_task):
    assert first_task.prompt.startswith("from typing import List") and "def has_close_elements" in first_task.prompt
    assert first_task.reference_answer and first_task.verifier.kind == "humaneval"
    assert env.verifier_version == CodeEnv(timeout_s=5.0).verifier_version
    assert env.verifier_version != CodeEnv(timeout_s=6.0).verifier_version
