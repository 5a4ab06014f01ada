"""One attached `docker exec`'s socket, read and written by the docker backend: stdin in, stdout and stderr out.

`send_stdin` writes the command's stdin (bytes, or a file streamed in chunks) and then
shuts the socket's write side, so the command reads end of input. `read_until` feeds what
comes back into a `Capture` until the stream ends, the deadline passes, or the capture is
full: a Capture keeps at most `cap_bytes` of each stream in memory (the rest is read and
dropped, the `truncated` flags say so), or, given a `stdout_file`, writes stdout there
instead, at most `stdout_file_cap` bytes: past that it stops (`overflowed`), so a command
that writes too much cannot fill the host's disk or this process's memory.

What it does not do: start the exec, know what the bytes mean, or kill the command.
"""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass, field
from typing import BinaryIO

from rlpipe.sandbox.docker_warm import FrameSplitter
from rlpipe.sandbox.image import SANDBOX_UID

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Identity:
    """Who a `docker exec` runs as, and its whole environment."""

    user: str
    environment: tuple[tuple[str, str], ...]


AGENT = Identity(f"{SANDBOX_UID}:{SANDBOX_UID}", (("HOME", "/work"),))
"""The sandboxed code's commands (and rlpipe's own file actions, as the same user)."""
TESTS = Identity(AGENT.user, (("HOME", "/tmp"), ("PYTHONNOUSERSITE", "1")))
"""A task's tests: HOME out of the agent's /work (no user site, .pth or dotfile of its own)."""
ROOT = Identity("0:0", (("HOME", "/tmp"),))
"""rlpipe's own steps around the tests; uid 0 without capabilities (cap_drop ALL): it owns
/tests and /logs, nothing more."""


@dataclass
class RawRun:
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    duration_s: float


@dataclass
class Capture:
    """Demultiplexes docker's framed exec stream, keeping at most `cap_bytes` per stream in memory,
    or writing stdout to `stdout_file` (at most `stdout_file_cap` bytes)."""

    cap_bytes: int | None
    stdout_file: BinaryIO | None = None
    stdout_file_cap: int | None = None
    frames: FrameSplitter = field(default_factory=FrameSplitter)
    chunks: dict[int, bytearray] = field(default_factory=lambda: {1: bytearray(), 2: bytearray()})
    truncated: dict[int, bool] = field(default_factory=lambda: {1: False, 2: False})
    written: int = 0
    overflowed: bool = False

    def feed(self, data: bytes) -> None:
        for stream, piece in self.frames.feed(data):
            if stream == 1 and self.stdout_file is not None:
                self._write(piece)
            else:
                self._keep(stream, piece)

    def _write(self, piece: bytes) -> None:
        if self.overflowed:
            return
        if self.stdout_file_cap is not None and self.written + len(piece) > self.stdout_file_cap:
            self.overflowed = True
            return
        self.stdout_file.write(piece)
        self.written += len(piece)

    def _keep(self, stream: int, piece: bytes) -> None:
        kept = self.chunks[stream]
        room = len(piece) if self.cap_bytes is None else max(0, self.cap_bytes - len(kept))
        kept += piece[:room]
        if room < len(piece):
            self.truncated[stream] = True


def send_stdin(raw_socket: socket.socket, data: bytes | BinaryIO) -> None:
    """Send `data` (bytes, or an open file read to its end in chunks), then end the command's input."""
    try:
        if isinstance(data, bytes | bytearray):
            if data:
                raw_socket.sendall(data)
        else:
            while chunk := data.read(_CHUNK):
                raw_socket.sendall(chunk)
        raw_socket.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the command exited without reading all of its stdin


def read_until(raw_socket: socket.socket, capture: Capture, deadline: float) -> bool:
    """Feed the stream into capture until EOF or a full capture (False) or the deadline (True)."""
    while not capture.overflowed:
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        readable, _, _ = select.select([raw_socket], [], [], min(left, 1.0))
        if not readable:
            continue
        try:
            data = raw_socket.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            return False
        if not data:
            return False
        capture.feed(data)
    return False
