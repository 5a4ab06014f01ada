"""DockerSandbox.exec_python: the warm interpreter gives exec's results, and attacks on it only cost speed.

The attack suite runs through exec_python too (`rlpipe sandbox selftest --backend docker`);
these tests cover what is particular to docker's warm path: same results as a plain exec, a
server that requests can kill or stop (it is not the container's init) but that then only
makes the request run by exec (within what was left of its timeout), nothing a request started (orphans reparented to the
container's init included) and no /tmp file carried to the next request, the server kept
across reset() and replaced after a plain exec, and the fallback when it cannot start.
"""

from __future__ import annotations

import json
import threading

import pytest

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox.base import Limits
from tests.helpers.docker_engine import no_docker
from tests.helpers.waiting import wait_until
from tests.sandbox.warm_programs import COMMON_PROGRAMS, DENY_ALL_DEFAULT_ACL, IPC_FILL, IPC_TABLES, result_fields

pytestmark = pytest.mark.docker

SERVER_PID = "import os; print(os.getppid())"


@pytest.fixture
def sandbox():
    from rlpipe.sandbox.docker_backend import DockerSandbox

    try:
        made = DockerSandbox(Limits(timeout_s=10, output_bytes=1000))
    except SandboxUnavailable as exc:
        no_docker(exc.message)
    yield made
    made.close()


PROGRAMS = {
    **COMMON_PROGRAMS,
    "capped output": ("import sys; print('x' * 5000); print('y' * 5000, file=sys.stderr)", b""),
    "environment and cwd": ("import os; print(sorted(os.environ.items()), os.getcwd())", b""),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_exec_python_gives_what_a_plain_exec_gives(sandbox, name):
    code, stdin = PROGRAMS[name]
    warm = sandbox.exec_python(code, stdin, args=["a", "b"])
    plain = sandbox.exec(["python3", "-I", "-S", "-c", code, "a", "b"], stdin)
    assert result_fields(warm) == result_fields(plain)
    if name != "segfault":  # there the exec wrapper's shell adds its own "Segmentation fault" line
        assert warm.stderr == plain.stderr
    assert sandbox._warm is None  # the plain exec retired the server (its end-of-command kill would end it)


def test_the_server_is_reused_and_kept_across_reset(sandbox):
    server = sandbox.exec_python(SERVER_PID).stdout
    sandbox.write_files({"kept": b"x"})
    assert sandbox.exec_python("import os; print(os.listdir('/work'))").stdout == "['kept']\n"
    sandbox.reset()
    assert sandbox.exec_python("import os; print(os.listdir('/work'), os.listdir('/tmp'))").stdout == "[] []\n"
    assert sandbox.exec_python(SERVER_PID).stdout == server


def test_a_request_cannot_trace_or_read_the_server(sandbox):
    attack = """
import ctypes, json, os
server, outcome = os.getppid(), {}
for name in ("mem", "fd", "environ", "maps"):
    try:
        os.listdir(f"/proc/{server}/fd") if name == "fd" else open(f"/proc/{server}/{name}", "rb").read(1)
        outcome[name] = "read"
    except OSError as exc:
        outcome[name] = exc.strerror
outcome["ptrace"] = ctypes.CDLL(None, use_errno=True).ptrace(16, server, None, None)  # PTRACE_ATTACH
outcome["fds"] = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
print(json.dumps(outcome))
"""
    outcome = json.loads(sandbox.exec_python(attack).stdout)
    assert all(outcome[name] != "read" for name in ("mem", "fd", "environ", "maps")), outcome
    assert outcome["ptrace"] == -1, outcome
    assert outcome["fds"] == [0, 1, 2, 3], outcome  # stdio, and the listdir's own fd: no protocol fd


SERVER_ATTACKS = {
    "SIGKILL to the server": "import os, signal; os.kill(os.getppid(), signal.SIGKILL); print('after')",
    # waits until the server is gone (the request is reparented) before going on
    "SIGTERM to the server": ("import os, signal, time\nserver = os.getppid()\nos.kill(server, signal.SIGTERM)\n"
                              "while os.getppid() == server:\n    time.sleep(0.01)\nprint('after')"),
    "kill(-1)": "import os, signal; os.kill(-1, signal.SIGKILL); print('after')",
    "SIGSTOP to the server": "import os, signal; os.kill(os.getppid(), signal.SIGSTOP); print('after')",
}


@pytest.mark.parametrize("name", list(SERVER_ATTACKS))
def test_a_request_that_kills_or_stops_the_server_is_a_crash_or_a_timeout_never_a_rerun(sandbox, name):
    code = SERVER_ATTACKS[name]
    first_server = sandbox.exec_python(SERVER_PID).stdout
    stopped = name == "SIGSTOP to the server"
    # a killed server ends the request at once: its timeout only has to outlast a loaded machine
    warm = sandbox.exec_python(code + "\nopen('/work/runs', 'a').write('x')", timeout_s=2.0 if stopped else 120.0)
    if stopped:  # no answer: a timeout (a plain exec stops its shell: the same)
        assert (warm.exit_code, warm.timed_out) == (None, True)
    else:
        assert warm.exit_code is None and not warm.timed_out and "died during the request" in warm.stderr, warm
    runs = sandbox.exec_python("import os; print(open('/work/runs').read() if os.path.exists('/work/runs') else '')")
    assert runs.stdout in ("\n", "x\n")  # it ran once at most: never rerun
    after = sandbox.exec_python(SERVER_PID)
    assert after.exit_code == 0 and after.stdout != first_server  # a fresh server serves again


def test_nothing_a_request_started_and_no_tmp_file_reaches_the_next_request(sandbox):
    sandbox.exec_python("""
import os, time
open('/tmp/left', 'w').write('x'); open('/dev/shm/left', 'w').write('x'); open('/work/kept', 'w').write('x')
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(60)  # an orphan: the container's init becomes its parent, not the server
    os._exit(0)
""")
    after = sandbox.exec_python("import os; print(repr((sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), "
                                "os.getppid(), os.getpid(), os.listdir('/tmp'), os.listdir('/dev/shm'), os.listdir('/work'))))")
    pids, server, me, tmp, shm, work = eval(after.stdout)  # noqa: S307 - our own program's repr
    assert pids == sorted({1, server, me}), pids  # the container's init, the server and this request
    assert (tmp, shm, work) == ([], [], ["kept"])


def test_a_timed_out_request_is_killed_and_the_server_serves_the_next(sandbox):
    before = sandbox.exec_python(SERVER_PID).stdout
    result = sandbox.exec_python("import os\nos.fork()\nwhile True: pass", timeout_s=0.5)
    assert result.timed_out and result.exit_code is None
    after = sandbox.exec_python("import os\nprint(os.getppid())\n"
                                "print(repr((sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), os.getpid())))")
    server, seen = after.stdout.splitlines()
    assert server + "\n" == before  # the same server
    pids, me = eval(seen)  # noqa: S307 - our own program's repr
    assert pids == sorted({1, int(server), me}), pids  # the container's init, the server, this request: both spinners died


def test_a_memory_bomb_is_oom_killed_and_the_server_survives():
    from rlpipe.sandbox.docker_backend import DockerSandbox

    try:
        sandbox = DockerSandbox(Limits(timeout_s=20, memory_mb=128))
    except SandboxUnavailable as exc:
        no_docker(exc.message)
    with sandbox:
        before = sandbox.exec_python(SERVER_PID).stdout
        result = sandbox.exec_python("blocks = []\nwhile True: blocks.append(bytearray(16 << 20))")
        assert result.oom_killed and result.exit_code == 137 and not result.timed_out
        assert sandbox.exec_python(SERVER_PID).stdout == before


def test_a_request_that_kills_the_server_after_its_side_effect_is_a_crash_never_a_rerun(sandbox):
    """Killing the server must not buy the request a second run (and so a second time budget)."""
    code = "import os, signal\nopen('/work/runs', 'a').write('x')\nos.kill(os.getppid(), signal.SIGKILL)\nprint('after')"
    result = sandbox.exec_python(code, timeout_s=120.0)
    assert result.exit_code is None and not result.timed_out and "died during the request" in result.stderr
    assert "after" not in result.stdout
    assert sandbox.exec_python("print(open('/work/runs').read())").stdout == "x\n"  # it ran exactly once


def test_a_server_killed_from_outside_mid_request_makes_that_request_a_crash(sandbox):
    server = sandbox.exec_python(SERVER_PID).stdout.strip()

    def kill_the_server_once_the_request_runs() -> None:
        # one `docker exec` per poll: kill the server as soon as the request has said it started
        kill = ["/bin/sh", "-c", f"test -e /work/started && kill -9 {server}"]
        wait_until(lambda: sandbox._run(kill, b"", 30.0, 4096).exit_code == 0, "the request to start", every_s=0.2)

    killer = threading.Thread(target=kill_the_server_once_the_request_runs)
    killer.start()
    # the request sleeps longer than the killer's hang guard; the server's death ends it for us
    result = sandbox.exec_python("import time\nopen('/work/started', 'w').close()\ntime.sleep(150)\nprint('done')",
                                 timeout_s=300.0)
    killer.join()
    assert result.exit_code is None and not result.timed_out and "died during the request" in result.stderr
    assert sandbox.exec_python("print('again')").stdout == "again\n"  # a fresh server


def test_a_server_that_cannot_start_falls_back_to_exec(sandbox, monkeypatch):
    from rlpipe.sandbox import docker_backend

    monkeypatch.setattr(docker_backend, "_WARM_SERVER", ["python3", "-c", "import sys; sys.exit(3)"])
    result = sandbox.exec_python("print(6 * 7)")
    assert result.exit_code == 0 and result.stdout == "42\n"
    assert "closed its pipe" in sandbox._warm_failure


def test_a_worn_out_server_is_replaced(sandbox, monkeypatch):
    from rlpipe.sandbox import warm_python

    monkeypatch.setattr(warm_python, "MAX_REQUESTS", 2)
    servers = [sandbox.exec_python(SERVER_PID).stdout for _ in range(4)]
    assert servers[0] == servers[1] != servers[2] == servers[3]


def test_close_ends_the_server_stream(sandbox):
    sandbox.exec_python("pass")
    process = sandbox._warm.process
    sandbox.close()
    wait_until(lambda: process.poll() is not None and not process._reader.is_alive(), "the server stream to end")


def test_the_containers_init_is_out_of_reach_of_commands(sandbox):
    probe = """
import ctypes, os
outcome = [os.stat('/proc/1').st_uid]
try:
    open('/proc/1/mem', 'rb').read(1)
    outcome.append('read')
except OSError as exc:
    outcome.append(exc.strerror)
outcome.append(ctypes.CDLL(None, use_errno=True).ptrace(16, 1, None, None))  # PTRACE_ATTACH
try:
    os.kill(1, 9)
    outcome.append('signalled')
except OSError as exc:
    outcome.append(exc.strerror)
print(outcome)
"""
    for run in (lambda: sandbox.exec_python(probe), lambda: sandbox.exec(["python3", "-c", probe])):
        uid, mem, ptrace, kill = eval(run().stdout)  # noqa: S307 - our own program's repr
        assert uid != 1000 and mem != "read" and ptrace == -1 and kill != "signalled", (uid, mem, ptrace, kill)


def test_a_request_that_locks_up_work_does_not_reach_the_next_use(sandbox):
    sandbox.exec_python("""
import os
""" + DENY_ALL_DEFAULT_ACL + """
os.chmod('/work', 0)
""")
    sandbox.reset()
    sandbox.write_files({"solution.py": b"print(6 * 7)"})
    seen = sandbox.exec_python("import os, stat; print(oct(stat.S_IMODE(os.stat('/work').st_mode)), os.listxattr('/work'), "
                               "open('/work/solution.py').read())")
    assert seen.stdout == "0o700 [] print(6 * 7)\n", seen.stdout + seen.stderr


def test_ipc_objects_do_not_outlive_a_request_or_a_reset(sandbox):
    assert sandbox.exec_python(IPC_FILL).stdout == "made\n"
    assert sandbox.exec_python(IPC_TABLES).stdout == "[1, 1, 1]\n"  # removed by the warm server
    assert sandbox.exec(["python3", "-c", IPC_FILL]).stdout == "made\n"  # a plain exec: removed by reset's wipe
    sandbox.reset()
    assert sandbox.exec(["python3", "-c", IPC_TABLES]).stdout == "[1, 1, 1]\n"


@pytest.mark.parametrize("lock", ["os.chmod('/work', 0)", "path = '/work'\nfor _ in range(1500):\n    path += '/d'\n    os.mkdir(path)",
                                  "os.utime('/work', ns=(1111111111000434343, 1111111111000434343))"])
def test_a_locked_deep_or_stamped_work_dir_is_wiped_in_place(sandbox, lock):
    container = sandbox._container_id
    sandbox.exec_python("import os\n" + lock)
    sandbox.reset()
    sandbox.write_files({"solution.py": b"print(6 * 7)"})
    seen = sandbox.exec_python("import os, stat; print(oct(stat.S_IMODE(os.stat('/work').st_mode)), os.listdir('/work'), "
                               "os.stat('/work').st_mtime_ns != 1111111111000434343)")
    assert seen.stdout == "0o700 ['solution.py'] True\n", seen.stdout + seen.stderr
    assert sandbox._container_id == container  # wiped, not replaced
