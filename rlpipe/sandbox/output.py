"""Drive a child process's pipes: feed stdin, capture stdout/stderr up to a cap, keep a deadline.

One thread, one `selectors` loop over the three pipes. Bytes beyond the cap are read and
thrown away (never buffered), so 100 MB of output costs time, not memory, and a child that
writes forever never blocks on a full pipe. What it does not do: kill anything. It returns
when both output pipes are closed or the deadline passes, and the caller decides what to kill.
"""

from __future__ import annotations

import os
import selectors
import time
from dataclasses import dataclass
from typing import IO

_CHUNK_BYTES = 1 << 16


@dataclass
class CappedBuffer:
    """Keeps the first `cap_bytes` bytes written to it and counts the rest."""

    cap_bytes: int
    data: bytearray
    dropped_bytes: int = 0

    def add(self, chunk: bytes) -> None:
        room = self.cap_bytes - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.dropped_bytes += max(0, len(chunk) - max(room, 0))

    @property
    def truncated(self) -> bool:
        return self.dropped_bytes > 0

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


@dataclass
class Captured:
    """What `pump` saw: both streams (capped) and whether the deadline passed first."""

    stdout: CappedBuffer
    stderr: CappedBuffer
    deadline_passed: bool


def pump(stdin_stream: IO[bytes] | None, stdout_fd: int, stderr_fd: int, stdin: bytes, cap_bytes: int, deadline: float) -> Captured:
    """Write `stdin`, read both outputs until they close or `time.monotonic()` passes `deadline`.

    Closes `stdin_stream` once all of `stdin` is written (so the child sees EOF); leaves the
    output fds open for the caller to close (closing them here would race with other threads
    that reuse the fd numbers). The cap applies to each stream separately.
    """
    stdin_fd = stdin_stream.fileno() if stdin_stream is not None else None
    stdout = CappedBuffer(cap_bytes, bytearray())
    stderr = CappedBuffer(cap_bytes, bytearray())
    buffers = {stdout_fd: stdout, stderr_fd: stderr}
    pending_stdin = memoryview(stdin)
    with selectors.DefaultSelector() as selector:
        for fd in (stdout_fd, stderr_fd):
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        if stdin_fd is not None:
            if pending_stdin:
                os.set_blocking(stdin_fd, False)
                selector.register(stdin_fd, selectors.EVENT_WRITE)
            else:
                stdin_stream.close()
                stdin_fd = None
        deadline_passed = False
        while buffers:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                deadline_passed = True
                break
            for key, _ in selector.select(timeout=remaining_s):
                fd = key.fd
                if fd == stdin_fd:
                    pending_stdin = _write_some(fd, pending_stdin)
                    if not pending_stdin:
                        selector.unregister(fd)
                        _close_quietly(stdin_stream)
                        stdin_fd = None
                    continue
                chunk = _read_some(fd)
                if chunk:
                    buffers[fd].add(chunk)
                elif chunk is not None:  # EOF
                    selector.unregister(fd)
                    del buffers[fd]
        if stdin_fd is not None:
            _close_quietly(stdin_stream)
    return Captured(stdout=stdout, stderr=stderr, deadline_passed=deadline_passed)


def _close_quietly(stream: IO[bytes]) -> None:
    try:
        stream.close()
    except OSError:  # BrokenPipeError when the child exited without reading
        pass


def _read_some(fd: int) -> bytes | None:
    try:
        return os.read(fd, _CHUNK_BYTES)
    except BlockingIOError:
        return None


def _write_some(fd: int, pending: memoryview) -> memoryview:
    try:
        written = os.write(fd, pending[:_CHUNK_BYTES])
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        return memoryview(b"")
    return pending[written:]
