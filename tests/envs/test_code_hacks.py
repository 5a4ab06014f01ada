"""Every reward-hack probe of rlpipe/envs/code_probes.py (the HumanEval ones and the
any-task ones the quality gate tries on every code task) scores 0 on each sandbox backend.

A probe answers correctly only if its attack worked (it found the tests, could read or
control the harness), and otherwise tries to make the verdict say ok by itself (a forged
nonce line, exit 0) or answers wrongly; so reward 0 means the attack failed. One sandbox
pool per backend for the module (bwrap: marked `bwrap`; docker: `docker`), skipped where
the backend cannot start (docker: only where no engine answers and none was provisioned,
tests/helpers/docker_engine.py). Probes that end by the timeout run with a 1.5 s one.

The probes are live attacks: `SAME_PROCESS_HARNESS`, the harness this verifier replaced
(the solution ran in the tests' process, with copied builtins and a nonce), is fooled by
the ones in `FOOLS_SAME_PROCESS` (test_the_probes_fool_a_same_process_harness).
"""

from __future__ import annotations

import json
import secrets

import pytest

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.core.records import VerdictReason
from rlpipe.envs.code import CodeEnv, verdict_from
from rlpipe.envs.code_probes import ANY_TASK_PROBES, PROBES, helpers
from rlpipe.sandbox.base import Limits
from tests.helpers.docker_engine import no_docker

BACKENDS = [pytest.param("bwrap", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)]
LIMITS = Limits(timeout_s=5, memory_mb=256, max_processes=32)
FOOLS_SAME_PROCESS = ["always_equal_object", "always_equal_int_subclass", "always_equal_float_subclass",
                      "always_equal_list_subclass", "read_the_harness_frames", "inspect_stack", "scan_process_memory",
                      "settrace_skips_asserts", "setprofile_reads_every_call", "redefine_a_prompt_helper"]
# The code env's harness before the tests moved out of the solution's process (git a725a26).
SAME_PROCESS_HARNESS = r'''
import builtins, os, sys

def describe(exc):
    where, tb = [], exc.__traceback__
    while tb is not None:
        where.append(tb.tb_frame.f_code.co_filename + ":" + str(tb.tb_lineno))
        tb = tb.tb_next
    return type(exc).__name__ + ": " + str(exc)[:500] + " (at " + " <- ".join(reversed(where[-3:])) + ")"

def main():
    # Everything used after the solution runs is bound here first: the solution may patch
    # the builtins module and `os` (e.g. builtins.exec, os.write, os._exit), not these locals.
    run_code, compile_code, copy, write, exit_now = exec, compile, dict, os.write, os._exit
    assertion_error, memory_error, base_exception = AssertionError, MemoryError, BaseException
    nonce, entry_point, test = sys.stdin.buffer.read().decode().split("\n", 2)
    report = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    clean_builtins = copy(builtins.__dict__)

    def finish(status, detail=""):
        if detail:
            write(2, detail[-2000:].encode(errors="replace") + b"\n")
        write(report, (nonce + " " + status + "\n").encode())
        exit_now(0 if status == "ok" else 1)

    try:
        with open("/work/solution.py", "rb") as source_file:
            code = compile_code(source_file.read(), "solution.py", "exec")
    except (SyntaxError, ValueError) as exc:
        finish("format", "solution does not compile: " + describe(exc))
    namespace = {"__name__": "solution", "__builtins__": copy(clean_builtins)}
    stage = "loading the solution"
    try:
        run_code(code, namespace)
        stage = "running the tests"
        if entry_point not in namespace:
            finish("format", "solution defines no " + entry_point)
        tests = copy(namespace)
        tests["__builtins__"] = copy(clean_builtins)
        run_code(compile_code(test, "tests.py", "exec"), tests)
        tests["check"](namespace[entry_point])
    except assertion_error as exc:
        finish("wrong", describe(exc))
    except memory_error:
        finish("oom", "MemoryError while " + stage)
    except base_exception as exc:
        finish("crash", "exception while " + stage + ": " + describe(exc))
    finish("ok")

main()
'''


@pytest.fixture(scope="module", params=BACKENDS)
def pool(request):
    from rlpipe.sandbox.pool import SandboxPool

    if request.param == "bwrap":
        from rlpipe.sandbox.bwrap import BwrapSandbox as backend
    else:
        from rlpipe.sandbox.docker_backend import DockerSandbox as backend
    try:
        sandbox_pool = SandboxPool(lambda: backend(LIMITS), 2)
    except SandboxUnavailable as exc:
        if request.param == "docker":
            no_docker(f"docker sandboxes cannot start here: {exc.message}")
        pytest.skip(f"{request.param} sandboxes cannot start here: {exc.message}")
    yield sandbox_pool
    sandbox_pool.close()


@pytest.fixture(scope="module")
def envs():
    return {"normal": CodeEnv(timeout_s=4.0), "short": CodeEnv(timeout_s=1.5)}


@pytest.mark.parametrize("probe", PROBES, ids=[probe.name for probe in PROBES])
def test_the_probe_scores_zero(pool, envs, probe):
    env = envs["short" if probe.slow else "normal"]
    task = env.task(probe.task_id)
    with pool.acquire() as sandbox:
        verdict = env.verify(task, probe.completion, sandbox)
    assert verdict.reward == 0.0 and not verdict.passed, (probe.name, verdict.reason, verdict.detail)
    assert verdict.reason is not VerdictReason.SANDBOX_ERROR


def test_the_probes_target_real_tasks_and_their_oracle_is_right(envs):
    """The probes' `_right` is HumanEval/0's answer: a probe whose attack worked would pass."""
    env = envs["normal"]
    namespace: dict = {}
    exec(compile(helpers(), "helpers.py", "exec"), namespace)  # noqa: S102 - definitions only, no attack
    reference: dict = {}
    exec(env.task("HumanEval/0").prompt + env.task("HumanEval/0").reference_answer, reference)  # noqa: S102
    cases = [([1.0, 2.0, 3.0], 0.5), ([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3), ([1.0, 2.0, 5.9, 4.0, 5.0], 0.95), ([], 1.0)]
    assert [namespace["_right"](*case) for case in cases] == [reference["has_close_elements"](*case) for case in cases]
    assert all(env.task(probe.task_id) is not None for probe in PROBES)
    assert len({probe.name for probe in PROBES}) == len(PROBES)


@pytest.mark.parametrize("name", FOOLS_SAME_PROCESS)
def test_the_probes_fool_a_same_process_harness(pool, envs, name):
    """Against the old harness the same completion passes: the probe's attack is real."""
    probe = next(probe for probe in PROBES if probe.name == name)
    spec = json.loads(envs["normal"].task(probe.task_id).verifier.payload)
    nonce = secrets.token_hex(16)
    with pool.acquire() as sandbox:
        sandbox.write_files({"solution.py": (spec["prompt"] + probe.completion).encode()})
        result = sandbox.exec_python(SAME_PROCESS_HARNESS, stdin=f"{nonce}\n{spec['entry_point']}\n{spec['test']}".encode(),
                                     timeout_s=4.0)
    assert verdict_from(result, nonce)[0] is VerdictReason.OK, verdict_from(result, nonce)


ANY_TASK_IDS = ("HumanEval/2", "HumanEval/53")  # float and int returns: no probe is aimed at them


@pytest.mark.parametrize("probe", ANY_TASK_PROBES, ids=[probe.name for probe in ANY_TASK_PROBES])
def test_an_any_task_probe_scores_zero_on_tasks_it_does_not_name(pool, envs, probe):
    """code_probes.ANY_TASK_PROBES (what `rlpipe qa` tries on every code task) fail here; the
    in-process code env of tests/qa/weak_envs.py is fooled by each (tests/qa/test_qa_probes.py)."""
    env = envs["normal"]
    for task_id in ANY_TASK_IDS:
        with pool.acquire() as sandbox:
            verdict = env.verify(env.task(task_id), probe.completion, sandbox)
        assert verdict.reward == 0.0 and verdict.reason is not VerdictReason.SANDBOX_ERROR, (task_id, verdict)
