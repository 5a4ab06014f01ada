"""A warm Python interpreter that runs inside a sandbox and forks one clean child per request.

This file is not imported by rlpipe: its text is run inside a sandbox as
`python3 -I -S -c <this file>` (stdlib only), as the pid namespace's pid 1, by
sandbox/warm_python.py. Each request is one `python3 -I -S -c CODE` with a stdin, a
timeout and an output cap, run in a child forked from this already-started interpreter,
so a request costs a fork instead of a sandbox start plus an interpreter start.

Per request: fork; the child closes every fd but fresh pipes on 0, 1 and 2, makes itself
the likeliest OOM victim, runs CODE as `__main__` and exits as Python would (SystemExit
codes, a traceback and 1 for an uncaught exception). The server feeds stdin, reads both
outputs up to the cap (the rest is read and dropped), and when the child exits or the
timeout passes it SIGKILLs every other process in the namespace (`kill(-1)` from pid 1
spares only itself) and reaps them all, then empties /tmp and /dev/shm. So, as with one
sandbox start per command, nothing a request started outlives it and no /tmp file carries
over; /work is left alone (its files belong to the sandbox's user and its reset).

Why the children cannot tamper with the server: it is pid 1 of the namespace, so no
process inside can signal it (the kernel drops signals to a namespace's init that it has no
handler for); it is not dumpable (PR_SET_DUMPABLE 0), so no process of the same uid can
ptrace it or read /proc/1/mem or /proc/1/fd; and its protocol fds are closed in every
child before the request's code runs.

Outside a pid namespace of its own (docker, where the container's init is pid 1), the
server is started with the argument `--not-init`: it then runs without being pid 1, and
is no longer immune to its requests (same uid: a request can kill or stop it). `kill(-1)`
spares pid 1 and itself, so it still kills every other process of the user; orphans are
reparented to the container's init, not to the server, so after reaping its own children
it waits (up to `ORPHANS_GONE_S`) until no other process is left, and answers "clean":
false if one is. The caller must treat a server that dies or stops answering as lost and
run the request some other way.

Protocol (fds 0 and 1 of the server, taken over at start; both point at /dev/null after):
each frame is a 4-byte big-endian length and that many bytes of JSON header, then raw
bytes. The server first sends {"ready": true}. A request is
{"code_len", "stdin_len", "timeout_s", "output_bytes", "args"} followed by the code and the stdin;
the answer is {"exit_code", "signal", "timed_out", "stdout_len", "stderr_len",
"stdout_dropped", "stderr_dropped", "clean", "server_cpu_s"} followed by the captured stdout
and stderr. "clean" is false when /tmp could not be emptied (or, with `--not-init`, a process
outlived the cleanup); the caller then retires the server. "server_cpu_s" is the CPU time
the server itself has used (its RLIMIT_CPU counts it).
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

_CHUNK = 1 << 16
_PR_SET_DUMPABLE = 4
_SCRATCH_DIRS = ("/tmp", "/dev/shm")
NOT_INIT = "--not-init" in sys.argv[1:]  # docker: the container's init is pid 1, not this server
ORPHANS_GONE_S = 2.0


def read_exact(fd, size):
    parts, remaining = [], size
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def send(fd, header, *payloads):
    encoded = json.dumps(header).encode()
    write_all(fd, struct.pack(">I", len(encoded)) + encoded + b"".join(payloads))


def child(code, args, stdin_r, stdout_w, stderr_w, libc):
    """In the forked child: become a fresh `python3 -c CODE` on the request's pipes; never returns."""
    status = 1
    try:
        os.dup2(stdin_r, 0)
        os.dup2(stdout_w, 1)
        os.dup2(stderr_w, 2)
        os.closerange(3, 65536)  # the protocol fds above all
        libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # as dumpable as a freshly started process
        try:
            with open("/proc/self/oom_score_adj", "w") as adjust:
                adjust.write("1000")  # under memory pressure, the request dies, not the server
        except OSError:
            pass
        sys.argv = ["-c", *args]
        namespace = {"__name__": "__main__", "__builtins__": builtins, "__doc__": None, "__spec__": None}
        try:
            exec(code, namespace)
            status = 0
        except SystemExit as exc:
            if exc.code is None:
                status = 0
            elif isinstance(exc.code, int):
                status = exc.code & 0xFF
            else:
                print(exc.code, file=sys.stderr)
                status = 1
        except BaseException as exc:
            import traceback

            # from the request's code down, as `python3 -c` prints it (without this frame)
            traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
            status = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
    finally:
        os._exit(status)


def kill_all_others():
    """SIGKILL and reap every process of the namespace but this one (pid 1); False if one is left.

    With `--not-init`, pid 1 is spared too and reaps the orphans: wait until they are gone.
    """
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return others_gone() if NOT_INIT else True


def others_gone():
    """Kill until no process but pid 1 and this one is left (at most ORPHANS_GONE_S); whether none is."""
    deadline = time.monotonic() + ORPHANS_GONE_S
    spared = {"1", str(os.getpid())}
    while any(name.isdigit() and name not in spared for name in os.listdir("/proc")):
        if time.monotonic() > deadline:
            return False
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        time.sleep(0.001)
    return True


def empty_scratch():
    """Delete everything under /tmp and /dev/shm; False if something could not be deleted."""
    clean = True
    for top in _SCRATCH_DIRS:
        try:
            names = os.listdir(top)
        except OSError:
            continue
        for name in names:
            clean = remove(os.path.join(top, name)) and clean
    return clean


def remove(path):
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            for name in os.listdir(path):
                remove(os.path.join(path, name))
            os.rmdir(path)
        else:
            os.unlink(path)
        return True
    except OSError:
        return False


def run(request, code, stdin, compiled, libc):
    """One request: fork, feed, capture, time out, clean up; returns (header, stdout, stderr)."""
    try:
        program = compiled.get(code)
        if program is None:
            program = compiled[code] = compile(code, "<string>", "exec")
    except (SyntaxError, ValueError) as exc:  # what `python3 -c` prints and exits with
        import traceback

        message = "".join(traceback.format_exception_only(type(exc), exc)).encode()
        return {"exit_code": 1, "signal": 0, "timed_out": False, "stdout_len": 0, "stderr_len": len(message),
                "stdout_dropped": 0, "stderr_dropped": 0, "clean": True,
                "server_cpu_s": sum(os.times()[:2])}, b"", message
    cap = int(request["output_bytes"])
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        child(program, [str(arg) for arg in request.get("args", [])], stdin_r, stdout_w, stderr_w, libc)
    for fd in (stdin_r, stdout_w, stderr_w):
        os.close(fd)
    deadline = started + float(request["timeout_s"])
    kept = {stdout_r: bytearray(), stderr_r: bytearray()}
    dropped = {stdout_r: 0, stderr_r: 0}
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
                kill_all_others()  # stray grandchildren may hold the pipes open: end them
                continue
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:
                continue
            if not chunk:
                readers.remove(fd)
                continue
            room = cap - len(kept[fd])
            if room > 0:
                kept[fd] += chunk[:room]
            dropped[fd] += max(0, len(chunk) - max(room, 0))
    if exit_status is None:  # timed out: the child is still running
        os.kill(pid, signal.SIGKILL)
        exit_status = os.waitpid(pid, 0)[1]
    alone = kill_all_others()
    for fd in [pidfd, stdout_r, stderr_r, *writers]:
        os.close(fd)
    signalled = os.WIFSIGNALED(exit_status)
    header = {
        "exit_code": 128 + os.WTERMSIG(exit_status) if signalled else os.WEXITSTATUS(exit_status),
        "signal": os.WTERMSIG(exit_status) if signalled else 0,
        "timed_out": timed_out,
        "stdout_len": len(kept[stdout_r]), "stderr_len": len(kept[stderr_r]),
        "stdout_dropped": dropped[stdout_r], "stderr_dropped": dropped[stderr_r],
        "clean": empty_scratch() and alone,
        "server_cpu_s": sum(os.times()[:2]),
    }
    return header, bytes(kept[stdout_r]), bytes(kept[stderr_r])


def main():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise SystemExit("warm server: cannot make itself non-dumpable")
    if os.getpid() != 1 and not NOT_INIT:
        raise SystemExit("warm server: must be the pid namespace's pid 1 (or be told --not-init)")
    requests_fd, answers_fd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    compiled = {}
    send(answers_fd, {"ready": True})
    while True:
        size = read_exact(requests_fd, 4)
        if size is None:
            return
        request = json.loads(read_exact(requests_fd, struct.unpack(">I", size)[0]))
        code = read_exact(requests_fd, int(request["code_len"])).decode()
        stdin = read_exact(requests_fd, int(request["stdin_len"])) or b""
        header, out, err = run(request, code, stdin, compiled, libc)
        send(answers_fd, header, out, err)


if __name__ == "__main__":  # as `python3 -c` runs it
    main()
