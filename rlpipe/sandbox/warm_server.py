"""A warm Python interpreter that runs inside a sandbox and forks one clean child per request.

Its text, below those of programs/cleanup.py (the tree and IPC wipes it shares with
docker's wipe) and programs/warm_cleanup.py (what the server does and checks after each
request: kill, empty, compare with the baseline), is run inside a sandbox as `python3 -I -S -c <text>` (stdlib only), as the
pid namespace's pid 1, by sandbox/warm_python.py (rlpipe itself never imports it). Each
request is one `python3 -I -S -c CODE` with a stdin, a timeout and an output cap, run in a
child forked from this already-started interpreter, so a request costs a fork instead of
a sandbox start plus an interpreter start.

Per request: fork; the child closes every fd but fresh pipes on 0, 1 and 2, makes itself
the likeliest OOM victim, runs CODE as `__main__` and exits as Python would (SystemExit
codes, a traceback and 1 for an uncaught exception). The server feeds stdin, reads both
outputs up to the cap (the rest is read and dropped), and when the child exits or the
timeout passes it SIGKILLs every other process in the namespace (`kill(-1)` from pid 1
spares only itself) and reaps them all, removes System V IPC objects, empties /tmp,
/dev/shm and /dev/mqueue, and zeroes the buffers that held the request's stdin and output
(later requests are forked from this heap). So, as with one sandbox start per command,
nothing a request started outlives it and no /tmp file carries over; /work is left alone
(its files belong to the sandbox's user and its reset).

Why the children cannot tamper with the server: it is pid 1 of the namespace, so no
process inside can signal it (the kernel drops signals to a namespace's init that it has no
handler for, and SIGINT is set back to SIG_DFL); it is not dumpable (PR_SET_DUMPABLE 0), so
no process of the same uid can ptrace it or read /proc/1/mem or /proc/1/fd; its protocol
fds are closed in every child before the request's code runs; and what a same-uid process
may still change on it or in the namespace (rlimits, nice, affinity, scheduler, I/O
priority, autogroup, keys, the namespaces' sysctls, the scratch dirs' modes and ACLs) is
compared after each request with what it was at start: any difference is "residue", and
the caller retires the server.

Outside a pid namespace of its own (docker, where the container's init is pid 1), the
server is started with the argument `--not-init`: it then runs without being pid 1, and
is no longer immune to its requests (same uid: a request can kill or stop it). `kill(-1)`
spares pid 1 and itself, so it still kills every other process of the user; orphans are
reparented to the container's init, not to the server, so after reaping its own children
it waits (up to `ORPHANS_GONE_S`) until no other process is left, and answers "clean":
false if one is. A server that dies or stops answering mid-request is the request's doing:
the caller reports a crash or a timeout for it (warm_python.py), never a rerun.

Protocol (fds 0 and 1 of the server, taken over at start; both point at /dev/null after):
each frame is a 4-byte big-endian length and that many bytes of JSON header, then raw
bytes. The server first sends {"ready": true}. A request is
{"code_len", "stdin_len", "timeout_s", "output_bytes", "args"} followed by the code and the stdin;
the answer is {"exit_code", "signal", "timed_out", "stdout_len", "stderr_len",
"stdout_dropped", "stderr_dropped", "clean", "residue", "server_cpu_s"} followed by the
captured stdout and stderr. "clean" is false, with "residue" saying why, when the request
left something behind (see above), a scratch dir could not be emptied, or (with
`--not-init`) a process outlived the cleanup; the caller then retires the server.
"server_cpu_s" is the CPU time the server itself has used (its RLIMIT_CPU counts it).
End of input ends the server.
"""

import builtins
import ctypes
import json
import os
import select
import signal
import struct
import sys
import time
import warnings

if __name__ != "__main__":  # imported (tests, tools); in a sandbox, the texts of programs/cleanup.py and
    # programs/warm_cleanup.py come above this one
    from rlpipe.sandbox.programs.warm_cleanup import baseline_state, empty_scratch, kill_all_others, residue

_CHUNK = 1 << 16
_PR_SET_DUMPABLE = 4
_COMPILED_CACHE_SIZE = 16
NOT_INIT = "--not-init" in sys.argv[1:]  # docker: the container's init is pid 1, not this server

def read_exact(fd, size):
    parts, remaining = [], size
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


def read_exact_into(fd, size):
    """`size` bytes read straight into a bytearray (no intermediate copies: see wipe), or None at EOF."""
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        count = os.readv(fd, [view[got:]])
        if not count:
            wipe(buffer)
            return None
        got += count
    return buffer


def wipe(buffer, count=None):
    """Zero the first `count` bytes (default: all) of a bytearray in place: request data is
    wiped once answered, because a later request is forked from this heap."""
    count = len(buffer) if count is None else count
    if count:
        ctypes.memset(ctypes.addressof(ctypes.c_char.from_buffer(buffer)), 0, count)


class OutputBuffers:
    """The two capture buffers and the read scratch, allocated once and reused by every request
    (a fresh megabyte per stream per request cost more than the request)."""

    def __init__(self):
        self.stdout, self.stderr, self.scratch = bytearray(), bytearray(), bytearray(_CHUNK)

    def sized(self, cap):
        """(stdout, stderr) of at least `cap` bytes each, all zero."""
        if len(self.stdout) < cap:
            self.stdout, self.stderr = bytearray(cap), bytearray(cap)
        return self.stdout, self.stderr


def send(fd, header, *payloads):
    """One frame: the JSON header, then the payloads (memoryviews, written without copying them)."""
    encoded = json.dumps(header).encode()
    views = [memoryview(struct.pack(">I", len(encoded)) + encoded), *payloads]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views:
            views[0] = views[0][written:]


def child(program, code, args, stdin, stdin_r, stdout_w, stderr_w, libc):
    """In the forked child: become a fresh `python3 -c CODE` on the request's pipes; never returns.

    `program` is CODE compiled by the server, or None when compiling it warned (the child
    compiles it then, so the warnings reach the request's stderr as they would). `stdin`,
    the server's buffer of the request's input, is zeroed in the child's copy first: a
    fresh interpreter holds its stdin only in the pipe, so the code may read it from fd 0
    once (the code env's harness forks its untrusted half before it reads its secrets).
    """
    status = 1
    try:
        wipe(stdin)
        os.dup2(stdin_r, 0)
        os.dup2(stdout_w, 1)
        os.dup2(stderr_w, 2)
        os.closerange(3, 65536)  # the protocol fds above all
        os.setsid()  # its own session and autogroup, as bwrap --new-session gives an exec
        libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # as dumpable as a freshly started process
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the server runs with SIG_DFL
        try:
            with open("/proc/self/oom_score_adj", "w") as adjust:
                adjust.write("1000")  # under memory pressure, the request dies, not the server
        except OSError:
            pass
        sys.argv = ["-c", *args]
        namespace = {"__name__": "__main__", "__builtins__": builtins, "__doc__": None, "__spec__": None}
        try:
            exec(program if program is not None else compile(code, "<string>", "exec"), namespace)
            status = 0
        except SystemExit as exc:
            status = exit_status_of(exc)
        except BaseException as exc:
            # from the request's code down, as `python3 -c` prints it (this frame left out)
            exc.__traceback__ = exc.__traceback__.tb_next
            sys.excepthook(type(exc), exc, exc.__traceback__)
            status = 130 if isinstance(exc, KeyboardInterrupt) else 1
        status = finish_like_python(status)
    finally:
        os._exit(status)


def exit_status_of(exc):
    """The exit status `python3 -c` gives for an uncaught SystemExit."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF if -(1 << 63) <= exc.code < 1 << 63 else 255
    try:
        print(exc.code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def finish_like_python(status):
    """What interpreter shutdown does before exiting: join threads, run atexit, flush (120 if stdout fails)."""
    threading = sys.modules.get("threading")
    try:
        if threading is not None:
            threading._shutdown()
    except BaseException:
        pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            if stream is sys.stdout and status == 0:
                status = 120
    return status


def run(request, code, stdin, compiled, libc, baseline, buffers):
    """One request: fork, feed, capture, time out, clean up; returns (header, stdout, stderr).

    stdout and stderr are the reused buffers (the header says how much of each is filled);
    the caller zeroes what was filled, and `stdin`, once the answer is sent.
    """
    try:
        program = compiled.get(code)
        if program is None:
            with warnings.catch_warnings(record=True) as warned:
                warnings.simplefilter("always")
                program = compile(code, "<string>", "exec")
            if warned:  # the child compiles it again and its warnings go to the request's stderr
                program = None
            elif len(compiled) < _COMPILED_CACHE_SIZE:  # the same few programs, run again and again
                compiled[code] = program
    except (SyntaxError, ValueError) as exc:  # what `python3 -c` prints and exits with
        import traceback

        message = bytearray("".join(traceback.format_exception_only(type(exc), exc)).encode())
        return {"exit_code": 1, "signal": 0, "timed_out": False, "stdout_len": 0, "stderr_len": len(message),
                "stdout_dropped": 0, "stderr_dropped": 0, "clean": True,
                "server_cpu_s": sum(os.times()[:2])}, bytearray(), message
    cap = int(request["output_bytes"])
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        child(program, code, [str(arg) for arg in request.get("args", [])], stdin, stdin_r, stdout_w, stderr_w, libc)
    for fd in (stdin_r, stdout_w, stderr_w):
        os.close(fd)
    deadline = started + float(request["timeout_s"])
    kept = dict(zip((stdout_r, stderr_r), buffers.sized(cap)))  # never grown mid-request: no stale copy
    filled = {stdout_r: 0, stderr_r: 0}
    dropped = {stdout_r: 0, stderr_r: 0}
    scratch = buffers.scratch
    pending = memoryview(stdin)
    writers = [stdin_w] if pending else []
    if not pending:
        os.close(stdin_w)
    for fd in (stdin_w, stdout_r, stderr_r):
        if fd != stdin_w or pending:
            os.set_blocking(fd, False)
    pidfd = os.pidfd_open(pid)
    readers = [stdout_r, stderr_r]
    exit_status, timed_out = None, False
    while readers or exit_status is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        wait_on = readers + ([pidfd] if exit_status is None else [])
        readable, writable, _ = select.select(wait_on, writers, [], remaining)
        for fd in writable:
            try:
                pending = pending[os.write(fd, pending[:_CHUNK]):]
            except BlockingIOError:
                continue
            except BrokenPipeError:
                pending = pending[:0]
            if not pending:
                writers.remove(fd)
                os.close(fd)
        for fd in readable:
            if fd == pidfd:
                exit_status = os.waitpid(pid, 0)[1]
                kill_all_others(NOT_INIT)  # stray grandchildren may hold the pipes open: end them
                continue
            try:
                count = os.readv(fd, [scratch])
            except BlockingIOError:
                continue
            if not count:
                readers.remove(fd)
                continue
            taken = min(count, cap - filled[fd])
            # memoryview to memoryview: a bytearray slice assignment would make (and free) a copy
            memoryview(kept[fd])[filled[fd]:filled[fd] + taken] = memoryview(scratch)[:taken]
            filled[fd] += taken
            dropped[fd] += count - taken
    wipe(scratch)  # cheap: 64 KiB
    if exit_status is None:  # timed out: the child is still running
        os.kill(pid, signal.SIGKILL)
        exit_status = os.waitpid(pid, 0)[1]
    alone = kill_all_others(NOT_INIT)
    for fd in [pidfd, stdout_r, stderr_r, *writers]:
        os.close(fd)
    left = residue(baseline, libc)
    if not empty_scratch():
        left.append("scratch files that could not be deleted")
    if not alone:
        left.append("processes that outlived the cleanup")
    signalled = os.WIFSIGNALED(exit_status)
    header = {
        "exit_code": 128 + os.WTERMSIG(exit_status) if signalled else os.WEXITSTATUS(exit_status),
        "signal": os.WTERMSIG(exit_status) if signalled else 0,
        "timed_out": timed_out,
        "stdout_len": filled[stdout_r], "stderr_len": filled[stderr_r],
        "stdout_dropped": dropped[stdout_r], "stderr_dropped": dropped[stderr_r],
        "clean": not left, "residue": left,
        "server_cpu_s": sum(os.times()[:2]),
    }
    return header, kept[stdout_r], kept[stderr_r]


def main():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise SystemExit("warm server: cannot make itself non-dumpable")
    if os.getpid() != 1 and not NOT_INIT:
        raise SystemExit("warm server: must be the pid namespace's pid 1 (or be told --not-init)")
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as init, then, no signal from inside reaches it
    requests_fd, answers_fd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # fd 2 too: nothing may block on a pipe nobody reads
        os.dup2(null, fd)
    compiled, buffers = {}, OutputBuffers()
    baseline = baseline_state(libc)
    send(answers_fd, {"ready": True})
    while serve_one(requests_fd, answers_fd, compiled, libc, baseline, buffers):
        pass  # each request's data lives in serve_one's frame only: no later request finds it


def serve_one(requests_fd, answers_fd, compiled, libc, baseline, buffers):
    """Read one request, run it, answer; False at end of input."""
    size = read_exact(requests_fd, 4)
    if size is None:
        return False
    request = json.loads(read_exact(requests_fd, struct.unpack(">I", size)[0]))
    code = read_exact(requests_fd, int(request["code_len"])).decode()
    stdin = read_exact_into(requests_fd, int(request["stdin_len"]))
    if stdin is None:
        return False
    header, out, err = run(request, code, stdin, compiled, libc, baseline, buffers)
    send(answers_fd, header, memoryview(out)[:header["stdout_len"]], memoryview(err)[:header["stderr_len"]])
    wipe(stdin)
    wipe(out, header["stdout_len"])
    wipe(err, header["stderr_len"])
    return True


if __name__ == "__main__":  # as `python3 -c` runs it
    main()
