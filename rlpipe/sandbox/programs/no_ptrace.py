"""Run a command where no process can trace or write into another: `python3 -I -S no_ptrace.py
CMD ARGS...` installs a seccomp filter that fails ptrace, process_vm_readv, process_vm_writev,
pidfd_getfd and process_madvise with EPERM (on x86_64, its x32 and i386 ABIs, and aarch64),
then execs CMD. The filter holds for CMD and everything it starts, and cannot be removed.
What it does not stop: opening another process's /proc/PID/mem or /proc/PID/fd/N (a
read-only /proc stops the first: bwrap_verifier.py). What it costs: a task whose tests need a
debugger (gdb, strace: ptrace) cannot run them.

Why: a task's tests run the agent's code (a check imports its module in a child process) as
the tests' own uid, and a process may trace another of its uid: the agent's code could attach
to the check (its parent) and rewrite its exit status, so a wrong answer passed
(tests/agents/test_verifier_trust.py, "ptrace_the_checker"). Both sandboxes run the tests'
command through this program (sandbox/tests_runtime.py `verifier_argv`).

Standard library only (it runs in the sandbox's own Python, as `python3 -I -S`). Exit 125,
naming the cause, where the filter cannot be installed: the tests then do not run.
"""

import ctypes
import errno
import os
import struct
import sys

_LD_W_ABS, _JEQ_K, _AND_K, _RET_K = 0x20, 0x15, 0x54, 0x06
_ALLOW, _DENY = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
# (audit arch, mask on the syscall number, the numbers it fails)
_ARCHES = (
    (0xC000003E, 0xBFFFFFFF, (101, 310, 311, 521, 539, 540, 438, 440)),  # x86_64, and x32 (bit 30 cleared): its own numbers too
    (0x40000003, 0xFFFFFFFF, (26, 347, 348, 438, 440)),  # i386
    (0xC00000B7, 0xFFFFFFFF, (117, 270, 271, 438, 440)),  # aarch64
)
"""ptrace, process_vm_readv, process_vm_writev, then pidfd_getfd (438) and process_madvise (440),
which have one number on every arch."""


def filter_program():
    """The classic BPF program: per known arch, deny the listed numbers; allow the rest."""
    blocks = []
    for arch, mask, numbers in _ARCHES:
        body = [(_LD_W_ABS, 0, 0, 0)] + ([(_AND_K, 0, 0, mask)] if mask != 0xFFFFFFFF else [])
        body += [(_JEQ_K, "deny", 0, number) for number in numbers] + [(_RET_K, 0, 0, _ALLOW)]
        blocks.append([(_LD_W_ABS, 0, 0, 4), (_JEQ_K, 0, len(body), arch)] + body)
    code = [instruction for block in blocks for instruction in block] + [(_RET_K, 0, 0, _ALLOW), (_RET_K, 0, 0, _DENY)]
    deny = len(code) - 1
    return [(op, deny - index - 1 if jt == "deny" else jt, jf, k) for index, (op, jt, jf, k) in enumerate(code)]


def install():
    program = filter_program()
    raw = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *instruction) for instruction in program))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    fprog = Program(len(program), ctypes.cast(raw, ctypes.c_void_p))
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # NO_NEW_PRIVS, SECCOMP filter
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: no_ptrace.py CMD [ARGS...]")
    try:
        install()
    except (OSError, AttributeError) as exc:
        sys.stderr.write(f"rlpipe: cannot forbid ptrace to the tests (seccomp): {exc}; the tests did not run\n")
        sys.exit(125)
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
