"""BwrapSandbox.exec_python: the warm interpreter gives exec's results, and requests cannot touch it.

The attack suite runs through exec_python too (test_bwrap_attacks.py); these tests cover
what is particular to the warm path: same results as a plain exec, a server the requests
cannot kill, trace or reach, no process or /tmp file carried from one request to the next,
and the fallback to a plain exec when the server cannot start or dies mid-request.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from rlpipe.sandbox.base import Limits
from tests.sandbox._bwrap_support import require_bwrap

pytestmark = pytest.mark.bwrap

SERVER_START_TIME = "print(open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19])"


@pytest.fixture
def sandbox():
    require_bwrap()
    from rlpipe.sandbox.bwrap import BwrapSandbox

    with BwrapSandbox(Limits(timeout_s=10, output_bytes=1000)) as made:
        yield made


PROGRAMS = {
    "prints": ("import sys; print('out'); print('err', file=sys.stderr)", b""),
    "exit 3": ("raise SystemExit(3)", b""),
    "exit message": ("raise SystemExit('bye')", b""),
    "os._exit": ("import os; os._exit(5)", b""),
    "exception": ("def f():\n    1/0\nf()", b""),
    "syntax error": ("x = (", b""),
    "stdin and argv": ("import sys; print(len(sys.stdin.buffer.read()), sys.argv)", b"s" * 200_000),
    "capped output": ("print('x' * 5000)", b""),
    "segfault": ("import ctypes; ctypes.string_at(0)", b""),
    "name": ("print(__name__, sorted(k for k in globals() if not k.startswith('__')))", b""),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_exec_python_gives_what_a_plain_exec_gives(sandbox, name):
    code, stdin = PROGRAMS[name]
    warm = sandbox.exec_python(code, stdin, args=["a", "b"])
    plain = sandbox.exec(["python3", "-I", "-S", "-c", code, "a", "b"], stdin)
    assert (warm.exit_code, warm.stdout, warm.stdout_truncated, warm.stderr_truncated, warm.timed_out, warm.oom_killed) == (
        plain.exit_code, plain.stdout, plain.stdout_truncated, plain.stderr_truncated, plain.timed_out, plain.oom_killed)
    assert warm.stderr.replace("<string>", "") == plain.stderr.replace("<string>", "")


def test_a_request_cannot_kill_trace_or_reach_the_server(sandbox):
    first = sandbox.exec_python(SERVER_START_TIME).stdout
    attack = """
import ctypes, json, os, signal
outcome = {}
for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
    try:
        os.kill(1, sig)
        outcome[sig.name] = "sent"
    except OSError as exc:
        outcome[sig.name] = exc.strerror
for path in ("/proc/1/mem", "/proc/1/fd", "/proc/1/environ", "/proc/1/maps"):
    try:
        os.listdir(path) if path.endswith("fd") else open(path, "rb").read(1)
        outcome[path] = "read"
    except OSError as exc:
        outcome[path] = exc.strerror
libc = ctypes.CDLL(None, use_errno=True)
outcome["ptrace"] = libc.ptrace(16, 1, None, None)  # PTRACE_ATTACH
outcome["fds"] = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
print(json.dumps(outcome))
"""
    result = sandbox.exec_python(attack)
    import json

    outcome = json.loads(result.stdout)
    assert all(outcome[path] != "read" for path in ("/proc/1/mem", "/proc/1/fd", "/proc/1/environ", "/proc/1/maps")), outcome
    assert outcome["ptrace"] == -1, outcome
    assert outcome["fds"] == [0, 1, 2, 3], outcome  # stdio, and the listdir's own fd: no protocol fd
    time.sleep(0.2)
    after = sandbox.exec_python(SERVER_START_TIME)
    assert after.exit_code == 0 and after.stdout == first  # the same server, alive and serving


def test_nothing_a_request_started_and_no_tmp_file_reaches_the_next_request(sandbox):
    sandbox.exec_python("""
import os, time
open('/tmp/left', 'w').write('x'); open('/dev/shm/left', 'w').write('x'); open('/work/kept', 'w').write('x')
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(60)
    os._exit(0)
""")
    after = sandbox.exec_python("import os; print(repr((sorted(p for p in os.listdir('/proc') if p.isdigit()), "
                                "os.listdir('/tmp'), os.listdir('/dev/shm'), os.listdir('/work'))))")
    pids, tmp, shm, work = eval(after.stdout)  # noqa: S307 - our own program's repr
    assert len(pids) == 2 and "1" in pids, pids  # the server and this request, nothing else
    assert (tmp, shm, work) == ([], [], ["kept"])
    sandbox.reset()  # /work goes with the sandbox's use; the server stays
    assert sandbox.exec_python("import os; print(os.listdir('/work'))").stdout == "[]\n"


def test_a_timed_out_request_is_killed_and_the_server_serves_the_next(sandbox):
    before = sandbox.exec_python(SERVER_START_TIME).stdout
    result = sandbox.exec_python("import os\nos.fork()\nwhile True: pass", timeout_s=0.5)
    assert result.timed_out and result.exit_code is None and result.duration_s < 3
    assert sandbox.exec_python(SERVER_START_TIME).stdout == before


def test_a_server_that_cannot_start_falls_back_to_exec(sandbox, monkeypatch):
    from rlpipe.sandbox import bwrap

    monkeypatch.setattr(bwrap, "SERVER_ARGV", ["python3", "-c", "import sys; sys.exit(3)"])
    result = sandbox.exec_python("print(6 * 7)")
    assert result.exit_code == 0 and result.stdout == "42\n"
    assert "did not say ready" in sandbox._warm_failure or "closed its pipe" in sandbox._warm_failure


def test_a_server_killed_mid_request_falls_back_to_exec_for_that_request(sandbox):
    sandbox.exec_python("pass")
    server_pid = sandbox._warm[1]
    killer = threading.Timer(0.5, os.kill, (server_pid, signal.SIGKILL))
    killer.start()
    result = sandbox.exec_python("import time; time.sleep(1); print('done')")
    killer.join()
    assert result.exit_code == 0 and result.stdout == "done\n"
    assert sandbox.exec_python("print('again')").stdout == "again\n"  # a fresh server


def test_a_worn_out_server_is_replaced(sandbox, monkeypatch):
    from rlpipe.sandbox import warm_python

    monkeypatch.setattr(warm_python, "MAX_REQUESTS", 2)
    servers = []
    for _ in range(4):
        assert sandbox.exec_python("pass").exit_code == 0
        servers.append(sandbox._warm[1] if sandbox._warm else None)  # host pid of the server
    assert servers[1] is None and servers[3] is None  # retired after its second request
    assert servers[0] is not None and servers[2] is not None and servers[0] != servers[2]
