"""The tests runtime on both backends: test.sh's `pytest`, `python3 -m pytest`, `uvx ... pytest` and
`uv run pytest` run offline, the CTRF report is written, the runtime is read-only to the tests
and not on the agent's PATH, and a pytest.py the agent left in the work dir is not what `pytest` runs.
"""

from __future__ import annotations

import json

import pytest

from rlpipe.sandbox.base import Limits
from rlpipe.sandbox.tests_runtime import RUNTIME_PATH
from tests.helpers.docker_engine import require_docker_engine
from tests.sandbox._bwrap_support import require_bwrap

TEST_PY = b"def test_answer():\n    assert open('answer.txt').read().strip() == '42'\n"
REWARD = 'if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n'
COMMANDS = {
    "pytest": "pytest /tests/test_answer.py -rA",
    "python3 -m pytest": "python3 -m pytest /tests/test_answer.py -rA",
    "uvx": "uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest --ctrf /logs/verifier/ctrf.json /tests/test_answer.py -rA",
    "uv run": "uv pip install pytest && uv run --with pytest pytest /tests/test_answer.py",
}


def open_sandbox(backend: str):
    limits = Limits(timeout_s=60, memory_mb=512, disk_mb=64)
    if backend == "bwrap":
        require_bwrap()
        from rlpipe.sandbox.bwrap import BwrapSandbox

        return BwrapSandbox(limits)
    require_docker_engine()
    from rlpipe.sandbox.docker_backend import DockerSandbox

    return DockerSandbox(limits)


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request):
    made = open_sandbox(request.param)
    yield made
    made.close()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_pytest_test_sh_runs_offline_and_judges_the_work_dir(sandbox, command):
    sandbox.write_files({"answer.txt": b"41\n"})
    tests = {"test.sh": (COMMANDS[command] + "\n" + REWARD).encode(), "test_answer.py": TEST_PY}
    wrong = sandbox.run_verifier(["bash", "/tests/test.sh"], tests, 60.0)
    assert wrong.logs["reward.txt"].strip() == b"0", wrong.result.stdout + wrong.result.stderr
    sandbox.write_files({"answer.txt": b"42\n"})
    right = sandbox.run_verifier(["bash", "/tests/test.sh"], tests, 60.0)
    assert right.logs["reward.txt"].strip() == b"1", right.result.stdout + right.result.stderr
    if command == "uvx":
        report = json.loads(right.logs["ctrf.json"])
        assert report["results"]["summary"]["passed"] == 1


def test_the_runtime_is_read_only_to_the_tests_and_not_the_agents(sandbox):
    probe = (f"touch {RUNTIME_PATH}/bin/x 2>/dev/null && echo writable; rm -f {RUNTIME_PATH}/bin/pytest 2>/dev/null && "
             "echo removable; command -v pytest > /logs/verifier/where.txt; echo 1 > /logs/verifier/reward.txt\n")
    run = sandbox.run_verifier(["sh", "/tests/test.sh"], {"test.sh": probe.encode()}, 60.0)
    assert "writable" not in run.result.stdout and "removable" not in run.result.stdout
    assert run.logs["where.txt"].strip() == f"{RUNTIME_PATH}/bin/pytest".encode()
    agent = sandbox.exec(["sh", "-c", "command -v pytest uvx uv; python3 -c 'import pytest' 2>&1; echo done"])
    assert agent.stdout.strip().endswith("ModuleNotFoundError: No module named 'pytest'\ndone"), agent.stdout


def test_a_pytest_module_in_the_work_dir_is_not_the_pytest_that_runs(sandbox):
    forged = b"import sys, os\nos.makedirs('/logs/verifier', exist_ok=True)\nsys.exit(0)\n"
    sandbox.write_files({"pytest.py": forged, "answer.txt": b"41\n", "_pytest/__init__.py": forged})
    tests = {"test.sh": (COMMANDS["pytest"] + "\n" + REWARD).encode(), "test_answer.py": TEST_PY}
    run = sandbox.run_verifier(["bash", "/tests/test.sh"], tests, 60.0)
    assert run.logs["reward.txt"].strip() == b"0", run.result.stdout
    assert "1 failed" in run.result.stdout


def test_what_the_tests_write_under_logs_is_bounded_by_the_sandboxs_disk_on_bubblewrap():
    """The tests run the agent's code, which may write /logs/agent and /logs/verifier: on
    bubblewrap as root /logs is a tmpfs of the sandbox's disk limit (64 MB here), not the
    host's disk. Three files of 40 MB: the writes stop at the limit."""
    sandbox = open_sandbox("bwrap")
    try:
        if not sandbox.work_on_tmpfs:
            pytest.skip("not root: the work dir and /logs are plain folders, bounded per file only")
        fill = ("for i in 1 2 3; do dd if=/dev/zero of=/logs/agent/fill-$i bs=1M count=40 2>/dev/null; done; "
                "written=$(du -sm /logs | cut -f1); rm -f /logs/agent/fill-*; echo $written > /logs/verifier/written.txt\n")
        run = sandbox.run_verifier(["sh", "/tests/test.sh"], {"test.sh": fill.encode()}, 60.0)
    finally:
        sandbox.close()
    assert int(run.logs["written.txt"]) <= 64, run.result.stdout + run.result.stderr


def test_no_process_of_the_tests_can_write_anothers_memory_on_bubblewrap():
    """The agent's code, run by a check in a child process, could write the check's memory
    through /proc/PARENT/mem (same uid; ptrace itself is refused by the tests' seccomp filter):
    on bubblewrap the tests' /proc is read-only."""
    child = ("import os\ntry:\n    os.close(os.open('/proc/%d/mem' % os.getppid(), os.O_RDWR))\n    print('opened')\n"
             "except OSError as exc:\n    print('refused', exc.errno)\n")
    check = "import subprocess, sys\nprint(subprocess.run([sys.executable, '/tests/child.py'], capture_output=True, text=True).stdout)\n"
    sandbox = open_sandbox("bwrap")
    try:
        run = sandbox.run_verifier(["sh", "/tests/test.sh"], {"test.sh": b"python3 /tests/check.py\n",
                                                            "child.py": child.encode(), "check.py": check.encode()}, 60.0)
    finally:
        sandbox.close()
    assert run.result.stdout.split() == ["refused", "30"], run.result.stdout + run.result.stderr  # EROFS


def test_what_the_tests_leave_under_logs_is_read_then_gone_even_folders_only_their_owner_can_empty(sandbox):
    """The tests' code leaves folders under /logs mode 0555 and 0000 (on docker, root without
    capabilities could not empty them, and the failed clean-up was a sandbox error that took the
    trial out of the score): the reward is read, and /tests and /logs are empty for the next use."""
    lock = ("for top in /logs/verifier /logs/agent; do mkdir -p $top/kept/inner && echo x > $top/kept/inner/f && "
            "echo x > $top/kept/f && chmod 0 $top/kept/inner && chmod 555 $top/kept; done; echo 1 > /logs/verifier/reward.txt\n")
    run = sandbox.run_verifier(["sh", "/tests/test.sh"], {"test.sh": lock.encode()}, 60.0)
    assert run.logs["reward.txt"].strip() == b"1", run.result.stdout + run.result.stderr
    left = sandbox.exec(["sh", "-c", "ls -A /tests /logs 2>/dev/null | grep -v -e '^/' -e '^$'; true"])
    assert left.stdout.strip() == "", left.stdout
    again = sandbox.run_verifier(["sh", "/tests/test.sh"], {"test.sh": b"echo 0 > /logs/verifier/reward.txt\n"}, 60.0)
    assert again.logs == {"reward.txt": b"0\n"}, again.logs
