"""Programs and helpers shared by the warm-interpreter tests of both backends
(test_warm_python.py for bubblewrap, test_docker_warm_python.py for docker)."""

from __future__ import annotations

# exec_python must give what a plain exec gives for each of these (code, stdin)
COMMON_PROGRAMS = {
    "prints": ("import sys; print('out'); print('err', file=sys.stderr)", b""),
    "exit 3": ("raise SystemExit(3)", b""),
    "exit message": ("raise SystemExit('bye')", b""),
    "os._exit": ("import os; os._exit(5)", b""),
    "exception": ("def f():\n    1/0\nf()", b""),
    "syntax error": ("x = (", b""),
    "stdin and argv": ("import sys; print(len(sys.stdin.buffer.read()), sys.argv)", b"s" * 200_000),
    "segfault": ("import ctypes; ctypes.string_at(0)", b""),
}

# fills System V message queues and makes a 64 MB shared memory segment; prints "made"
IPC_FILL = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT, IPC_NOWAIT = 0o1000, 0o4000
message = ctypes.create_string_buffer(8200)
ctypes.memmove(message, (1).to_bytes(8, 'little'), 8)
for key in range(200):
    queue = libc.msgget(0x1000 + key, IPC_CREAT | 0o600)
    libc.msgsnd(queue, message, 8192, IPC_NOWAIT)
assert libc.shmget(0x77, 64 << 20, IPC_CREAT | 0o600) >= 0
print('made')
"""
# prints the line counts of the System V IPC tables: "[1, 1, 1]" (headers only) when none is left
IPC_TABLES = "print([len(open('/proc/sysvipc/' + t).read().splitlines()) for t in ('shm', 'msg', 'sem')])"

# a default ACL on /work that denies everyone everything (user::--- group::--- other::---)
DENY_ALL_DEFAULT_ACL = ("os.setxattr('/work', 'system.posix_acl_default', "
                        "bytes.fromhex('02000000' '01000000ffffffff' '04000000ffffffff' '20000000ffffffff'))")


def result_fields(result) -> tuple:
    """The fields of an ExecResult that exec_python and a plain exec must agree on (stderr aside)."""
    return (result.exit_code, result.stdout, result.stdout_truncated, result.stderr_truncated, result.timed_out,
            result.oom_killed)
