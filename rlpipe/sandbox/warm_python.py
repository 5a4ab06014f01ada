"""The host side of a warm interpreter: a started `warm_server.py` in a sandbox, one request at a time.

A backend starts the server as a long-lived sandboxed command (`SERVER_ARGV`, as the pid
namespace's pid 1; `NOT_INIT_SERVER_ARGV` where it cannot be, as in a docker container) and
wraps the process (or anything with a Popen's stdin, stdout, stderr and poll) in
`WarmInterpreter`; `run` then sends one `python3 -I -S -c CODE` request and returns the
server's answer. warm_server.py says what
each request gets (a forked child, fresh pipes, every process it started killed, /tmp and
/dev/shm emptied) and why the children cannot tamper with the server.

Failure handling is the caller's: `WarmServerLost` means the server was gone before it
took the request (start a fresh one, or run the request the slow way);
`WarmServerDiedMidRequest` means it died or spoke garbage after taking it (the request's
code may have done it, and may have run: report a crash, never rerun it with a fresh time
budget); `WarmServerHung` means no answer came within the request's timeout plus a grace
period (kill the sandbox's processes and report a timeout). What it does not do: start or kill processes, or know any backend.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import time
from dataclasses import dataclass

from rlpipe.sandbox.base import ExecResult
from rlpipe.sandbox.programs import program_source

# the server, below the wipes and the after-request checks it uses
SERVER_SOURCE = program_source("programs/cleanup.py", "programs/warm_cleanup.py", "warm_server.py")
SERVER_ARGV = ["python3", "-I", "-S", "-c", SERVER_SOURCE]
NOT_INIT_SERVER_ARGV = [*SERVER_ARGV, "--not-init"]  # requests can then kill it: see warm_server.py
START_TIMEOUT_S = 10.0
ANSWER_GRACE_S = 5.0  # killing and reaping after a timeout, emptying /tmp
MAX_REQUESTS = 1000  # then a fresh server (also retired by the backend when its CPU time grows)


class WarmServerLost(Exception):
    """The server is gone before the request reached it (the request did not run: run it elsewhere)."""


class WarmServerDiedMidRequest(WarmServerLost):
    """The server died or answered garbage after taking the request (it may have run: do not rerun it)."""


class WarmServerHung(WarmServerDiedMidRequest):
    """No answer within the request's timeout plus the grace period."""


@dataclass(frozen=True)
class WarmAnswer:
    """What one request did, as the server saw it."""

    exit_code: int  # 128 + signal when signalled
    signal: int  # 0 when it exited on its own
    timed_out: bool
    stdout: bytes
    stderr: bytes
    stdout_dropped: int
    stderr_dropped: int
    clean: bool  # False: the request left something behind (see residue): retire the server
    server_cpu_s: float = 0.0  # the server's own CPU time (RLIMIT_CPU counts it)
    residue: tuple[str, ...] = ()  # what the request left behind, when not clean

    def exec_result(self, duration_s: float, oom_killed: bool, killed: bool) -> ExecResult:
        """The ExecResult of this answer; `killed` (our timeout, an OOM kill) makes exit_code None."""
        return ExecResult(
            exit_code=None if killed else self.exit_code,
            stdout=self.stdout.decode("utf-8", errors="replace"), stderr=self.stderr.decode("utf-8", errors="replace"),
            stdout_truncated=self.stdout_dropped > 0, stderr_truncated=self.stderr_dropped > 0,
            duration_s=duration_s, timed_out=self.timed_out, oom_killed=oom_killed,
        )


def died_mid_request_result(exc: WarmServerDiedMidRequest, duration_s: float, oom_killed: bool) -> ExecResult:
    """What a request whose server died (a crash) or fell silent (a timeout) under it did; never rerun it."""
    timed_out = isinstance(exc, WarmServerHung)
    return ExecResult(exit_code=None, stdout="", stderr="" if timed_out else f"sandbox: {exc}",
                      stdout_truncated=False, stderr_truncated=False, duration_s=duration_s,
                      timed_out=timed_out, oom_killed=oom_killed)


class WarmInterpreter:
    """One running warm_server.py behind `process`'s stdin and stdout pipes."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.requests = 0
        self._answers_fd = process.stdout.fileno()
        header, _ = self._read_frame(time.monotonic() + START_TIMEOUT_S, payload=False)
        if header.get("ready") is not True:
            raise WarmServerLost(f"the warm server did not say ready: {header!r}")

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def due_for_retirement(self, answer: WarmAnswer, cpu_time_s: float) -> bool:
        """After `answer`: the request left something behind, the server has served MAX_REQUESTS,
        or its own CPU time (RLIMIT_CPU counts it) passed half of the sandbox's `cpu_time_s`."""
        return not answer.clean or self.requests >= MAX_REQUESTS or answer.server_cpu_s > cpu_time_s / 2

    def run(self, code: str, args: list[str], stdin: bytes, timeout_s: float, output_bytes: int) -> WarmAnswer:
        """Run `code` as `python3 -I -S -c code *args` would, in a forked child; one request at a time."""
        code_bytes = code.encode()
        header = json.dumps({"code_len": len(code_bytes), "stdin_len": len(stdin), "timeout_s": timeout_s,
                             "output_bytes": output_bytes, "args": args}).encode()
        self.requests += 1
        if not self.alive:
            raise WarmServerLost("the warm server exited before the request")
        try:
            self.process.stdin.write(struct.pack(">I", len(header)) + header + code_bytes + stdin)
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise WarmServerLost(f"cannot send a request to the warm server: {exc}") from exc
        try:
            answer, payload = self._read_frame(time.monotonic() + timeout_s + ANSWER_GRACE_S, payload=True)
        except WarmServerDiedMidRequest:
            raise
        except WarmServerLost as exc:
            raise WarmServerDiedMidRequest(f"the warm server died during the request: {exc}") from exc
        try:
            out_len, err_len = int(answer["stdout_len"]), int(answer["stderr_len"])
            if out_len + err_len != len(payload):
                raise ValueError(f"{out_len} + {err_len} bytes announced, {len(payload)} sent")
            return WarmAnswer(
                exit_code=int(answer["exit_code"]), signal=int(answer["signal"]), timed_out=bool(answer["timed_out"]),
                stdout=payload[:out_len], stderr=payload[out_len:],
                stdout_dropped=int(answer["stdout_dropped"]), stderr_dropped=int(answer["stderr_dropped"]),
                clean=bool(answer["clean"]), server_cpu_s=float(answer.get("server_cpu_s", 0.0)),
                residue=tuple(str(item) for item in answer.get("residue", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise WarmServerDiedMidRequest(f"the warm server answered garbage: {exc}") from exc

    def close_pipes(self) -> None:
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    def _read_frame(self, deadline: float, payload: bool) -> tuple[dict, bytes]:
        size = struct.unpack(">I", self._read_exact(4, deadline))[0]
        if size > 1 << 20:
            raise WarmServerLost(f"the warm server announced a {size}-byte header")
        try:
            header = json.loads(self._read_exact(size, deadline))
        except ValueError as exc:
            raise WarmServerLost(f"the warm server sent a header that is not JSON: {exc}") from exc
        if not isinstance(header, dict):
            raise WarmServerLost(f"the warm server sent a header that is not an object: {header!r}")
        if not payload:
            return header, b""
        try:
            length = int(header.get("stdout_len", 0)) + int(header.get("stderr_len", 0))
        except (TypeError, ValueError) as exc:
            raise WarmServerLost(f"the warm server sent bad lengths: {exc}") from exc
        return header, self._read_exact(length, deadline)

    def _read_exact(self, size: int, deadline: float) -> bytes:
        parts: list[bytes] = []
        remaining = size
        while remaining:
            wait_s = deadline - time.monotonic()
            if wait_s <= 0:
                raise WarmServerHung("the warm server did not answer in time")
            ready, _, _ = select.select([self._answers_fd], [], [], wait_s)
            if not ready:
                continue
            chunk = os.read(self._answers_fd, min(remaining, 1 << 20))
            if not chunk:
                raise WarmServerLost("the warm server closed its pipe")
            parts.append(chunk)
            remaining -= len(chunk)
        return b"".join(parts)
