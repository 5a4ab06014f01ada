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

import pytest

from rlpipe.sandbox.base import Limits
from tests.helpers.waiting import wait_until
from tests.sandbox._bwrap_support import require_bwrap
from tests.sandbox.warm_programs import COMMON_PROGRAMS, DENY_ALL_DEFAULT_ACL, IPC_FILL, IPC_TABLES, result_fields

pytestmark = pytest.mark.bwrap

SERVER_START_TIME = "print(open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19])"


@pytest.fixture
def sandbox():
    require_bwrap()
    from rlpipe.sandbox.bwrap import BwrapSandbox

    with BwrapSandbox(Limits(timeout_s=10, output_bytes=1000)) as made:
        yield made


PROGRAMS = {
    **COMMON_PROGRAMS,
    "capped output": ("print('x' * 5000)", b""),
    "name": ("print(__name__, sorted(k for k in globals() if not k.startswith('__')))", b""),
    "syntax warning": ("x = 'a' is 'a'\nprint(x)", b""),
    "exit overflow": ("import sys; sys.exit(2**63)", b""),
    "keyboard interrupt": ("raise KeyboardInterrupt", b""),
    "atexit": ("import atexit; atexit.register(print, 'bye'); print('hi')", b""),
    "thread": ("import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.2), print('late'))).start()", b""),
    "excepthook": ("import sys\nsys.excepthook = lambda *exc: print('hooked', exc[0].__name__)\n1/0", b""),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_exec_python_gives_what_a_plain_exec_gives(sandbox, name):
    code, stdin = PROGRAMS[name]
    warm = sandbox.exec_python(code, stdin, args=["a", "b"])
    plain = sandbox.exec(["python3", "-I", "-S", "-c", code, "a", "b"], stdin)
    assert result_fields(warm) == result_fields(plain)
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
    # no wait needed: a signal is pending on the server once os.kill returned, and a pending
    # SIGKILL or SIGSTOP acts before the server runs again, so before it could answer this
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
    assert result.timed_out and result.exit_code is None
    after = sandbox.exec_python(SERVER_START_TIME + "\nimport os; print(sorted(p for p in os.listdir('/proc') if p.isdigit()))")
    server_started, pids = after.stdout.splitlines()
    assert server_started + "\n" == before  # the same server
    assert len(eval(pids)) == 2, pids  # noqa: S307 - the server and this request: both spinners were killed


def test_a_server_that_cannot_start_falls_back_to_exec(sandbox, monkeypatch):
    from rlpipe.sandbox import bwrap

    monkeypatch.setattr(bwrap, "SERVER_ARGV", ["python3", "-c", "import sys; sys.exit(3)"])
    result = sandbox.exec_python("print(6 * 7)")
    assert result.exit_code == 0 and result.stdout == "42\n"
    assert "did not say ready" in sandbox._warm_failure or "closed its pipe" in sandbox._warm_failure


def test_a_server_killed_mid_request_makes_that_request_a_crash_not_a_rerun(sandbox):
    sandbox.exec_python("pass")
    server_pid = sandbox._warm[1]

    def kill_the_server_once_the_request_runs() -> None:
        wait_until(lambda: (sandbox.work_dir / "started").exists(), "the request to start")
        os.kill(server_pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_server_once_the_request_runs)
    killer.start()
    # the request sleeps longer than the killer's hang guard, and ends with the server (its pid 1)
    result = sandbox.exec_python("import time\nopen('/work/started', 'w').close()\ntime.sleep(150)\n"
                                 "open('/work/runs', 'a').write('x'); print('done')", timeout_s=300)
    killer.join()
    assert result.exit_code is None and not result.timed_out and "died during the request" in result.stderr
    assert sandbox.exec_python("print(open('/work/runs').read() if __import__('os').path.exists('/work/runs') else '')"
                               ).stdout == "\n"  # it ran once at most, and was not rerun
    assert sandbox.exec_python("print('again')").stdout == "again\n"  # a fresh server


def test_no_signal_from_inside_reaches_the_server(sandbox):
    first = sandbox.exec_python(SERVER_START_TIME).stdout
    result = sandbox.exec_python("""
import os, signal
for number in range(1, signal.SIGRTMAX + 1):
    try:
        os.kill(1, number)
    except OSError:
        pass
print('sent')
""")
    assert result.stdout == "sent\n"
    assert sandbox.exec_python(SERVER_START_TIME).stdout == first  # pending signals act before it could answer


TAMPERING = {
    "rlimit": "import resource; resource.prlimit(1, resource.RLIMIT_AS, (1 << 28, 1 << 28))",
    "nice": "import os; os.setpriority(os.PRIO_PROCESS, 1, 19)",
    "affinity": "import os; os.sched_setaffinity(1, {sorted(os.sched_getaffinity(1))[0]})",
    "scheduler": "import os; os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0))",
}
SETTINGS = ("import os, resource; print(resource.getrlimit(resource.RLIMIT_AS), os.getpriority(os.PRIO_PROCESS, 0), "
            "len(os.sched_getaffinity(0)), os.sched_getscheduler(0))")


@pytest.mark.parametrize("name", list(TAMPERING))
def test_a_request_that_changes_the_servers_settings_retires_it(sandbox, name):
    clean = sandbox.exec_python(SETTINGS).stdout
    sandbox.exec_python(TAMPERING[name])
    assert sandbox.exec_python(SETTINGS).stdout == clean  # forked from a fresh server


def test_ipc_objects_keys_and_deep_trees_do_not_reach_the_next_request(sandbox):
    made = sandbox.exec_python("""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT, IPC_PRIVATE = 0o1000, 0
assert libc.shmget(IPC_PRIVATE, 1 << 20, IPC_CREAT | 0o600) >= 0
assert libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600) >= 0
open('/dev/mqueue/left', 'w').close()
path = '/tmp'
for _ in range(1500):
    path += '/d'
    os.mkdir(path)
print('made')
""")
    assert made.stdout == "made\n", made.stderr
    seen = sandbox.exec_python("""
import os
print([len(open('/proc/sysvipc/' + kind).read().splitlines()) for kind in ('shm', 'msg', 'sem')],
      os.listdir('/dev/mqueue'), os.listdir('/tmp'))
""")
    assert seen.stdout == "[1, 1, 1] [] []\n", seen.stdout + seen.stderr


def test_a_worn_out_server_is_replaced(sandbox, monkeypatch):
    from rlpipe.sandbox import warm_python

    monkeypatch.setattr(warm_python, "MAX_REQUESTS", 2)
    servers = []
    for _ in range(4):
        assert sandbox.exec_python("pass").exit_code == 0
        servers.append(sandbox._warm[1] if sandbox._warm else None)  # host pid of the server
    assert servers[1] is None and servers[3] is None  # retired after its second request
    assert servers[0] is not None and servers[2] is not None and servers[0] != servers[2]


def test_a_request_that_locks_up_work_or_tmp_does_not_reach_the_next_use(sandbox):
    sandbox.exec_python("""
import os
open('/tmp/kept', 'w').write('x')
os.setxattr('/work', 'user.note', b'left by an earlier sample')
""" + DENY_ALL_DEFAULT_ACL + """
for path in ('/work', '/tmp', '/dev/shm'):
    os.chmod(path, 0)
""")
    sandbox.reset()
    sandbox.write_files({"solution.py": b"print(6 * 7)"})
    seen = sandbox.exec_python("import os, stat; print(oct(stat.S_IMODE(os.stat('/work').st_mode)), os.listxattr('/work'), "
                               "os.listdir('/tmp'), open('/work/solution.py').read())")
    assert seen.stdout == "0o700 [] [] print(6 * 7)\n", seen.stdout + seen.stderr


def test_autogroup_nice_and_namespace_sysctls_do_not_reach_the_next_request(sandbox):
    probe = "print(open('/proc/self/autogroup').read().split()[-1], open('/proc/sys/kernel/msgmni').read().strip())"
    clean = sandbox.exec_python(probe).stdout
    tampered = sandbox.exec_python("open('/proc/self/autogroup', 'w').write('19')\n"
                                   "open('/proc/sys/kernel/msgmni', 'w').write('0')\n" + probe)
    assert tampered.stdout != clean  # the request itself did change both
    assert sandbox.exec_python(probe).stdout == clean


def test_a_request_cannot_find_the_previous_requests_output_on_the_stack(sandbox):
    sandbox.exec_python("print('-'.join(['secret', 'output']))")  # the text is in the output only, not the code
    found = sandbox.exec_python("""
import sys
needle = '-'.join(['secret', 'output'])
frame, hits = sys._getframe().f_back, []
while frame is not None:
    hits += [name for name, value in frame.f_locals.items()
             if isinstance(value, (bytes, str)) and needle in (value.decode(errors='replace') if isinstance(value, bytes) else value)]
    frame = frame.f_back
print(hits)
""")
    assert found.stdout == "[]\n", found.stdout + found.stderr


MARK_SCAN = r"""
import re
pattern, hits = re.compile(rb'(?:QZXJ){8}'), 0
with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:
    for line in maps:
        span, perms = line.split()[:2]
        start, end = (int(bound, 16) for bound in span.split('-'))
        if 'rw' not in perms or end - start > 256 << 20:
            continue
        try:
            mem.seek(start)
            hits += len(pattern.findall(mem.read(end - start)))
        except (OSError, ValueError, OverflowError):
            pass
print(hits)
"""


@pytest.mark.parametrize("size", [2, 10, 40, 4000])
def test_a_request_finds_no_trace_of_an_earlier_requests_stdin_or_output_in_its_memory(sandbox, size):
    # the mark is built at run time, so no code object (the server caches those) holds it
    mark = b"QZXJ" * 8
    sandbox.exec_python("import sys\nm = ''.join(['QZXJ'] * 8)\nsys.stdout.write(m * %d)\nsys.stderr.write(m * %d)"
                        % (size, size), stdin=mark * size)
    assert sandbox.exec_python(MARK_SCAN).stdout == "0\n"


def test_ipc_objects_a_request_leaves_are_removed_and_their_memory_freed(sandbox):
    made = sandbox.exec_python(IPC_FILL)
    assert made.stdout == "made\n", made.stderr
    seen = sandbox.exec_python(IPC_TABLES)
    assert seen.stdout == "[1, 1, 1]\n"


def test_timestamps_of_scratch_dirs_and_work_carry_nothing_to_the_next_use(sandbox):
    stamp = 1_111_111_111_000_434_343
    sandbox.exec_python(f"import os\nfor path in ('/tmp', '/dev/shm', '/dev/mqueue', '/work'):\n"
                        f"    os.utime(path, ns=({stamp}, {stamp}))")
    sandbox.reset()
    times = sandbox.exec_python("import os; print([os.stat(p).st_mtime_ns for p in ('/tmp', '/dev/shm', '/dev/mqueue', '/work')])")
    assert str(stamp) not in times.stdout and times.exit_code == 0, times
