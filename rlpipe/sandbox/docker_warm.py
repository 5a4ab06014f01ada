"""Docker's exec stream, split and seen as a process: what the docker backend's warm interpreter talks to.

`docker exec` (attached, no tty) gives one socket that carries the command's stdin one way
and, the other way, its stdout and stderr multiplexed in frames (an 8-byte header: the
stream, three zero bytes, a big-endian uint32 length). `FrameSplitter` cuts that byte
stream into (stream, bytes) pieces as it arrives; the backend's `exec` keeps them up to its
output cap, and `ExecStreamProcess` turns one long-lived exec into the Popen-like object
that `warm_python.WarmInterpreter` reads: `stdin.write` sends on the socket, a thread
copies the stdout frames into a local pipe whose read end is `stdout.fileno()` (and keeps
the first `STDERR_KEPT` bytes of stderr, for a server that fails to start), and `poll()` is
None until the stream ends.

What it does not do: start, signal or wait for the command (the backend does, with docker
execs of its own); know what is sent over the stream; bound reads (WarmInterpreter's
deadline does). Only a send that stalls for `SEND_TIMEOUT_S` fails on its own.
"""

from __future__ import annotations

import os
import socket
import struct
import threading

STDERR_KEPT = 4096
SEND_TIMEOUT_S = 30
STOP_WAIT_S = 5.0


class FrameSplitter:
    """Cuts docker's multiplexed exec stream into (stream, bytes) pieces; stream 1 is stdout, 2 stderr."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._frame_left = 0
        self._frame_stream = 1

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The pieces of frames that `data` completes or continues (a frame may come in several pieces)."""
        self._pending += data
        pieces = []
        while self._pending:
            if self._frame_left == 0:
                if len(self._pending) < 8:
                    break
                self._frame_stream, self._frame_left = struct.unpack(">BxxxL", self._pending[:8])
                del self._pending[:8]
                continue
            piece = bytes(self._pending[: self._frame_left])
            del self._pending[: len(piece)]
            self._frame_left -= len(piece)
            pieces.append((self._frame_stream if self._frame_stream in (1, 2) else 2, piece))
        return pieces


class _SocketStdin:
    """The write side of the exec socket, as a Popen's stdin."""

    def __init__(self, raw_socket: socket.socket) -> None:
        self._socket = raw_socket

    def write(self, data: bytes) -> None:
        self._socket.sendall(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        try:
            self._socket.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class ExecStreamProcess:
    """One attached `docker exec`, seen as the Popen that WarmInterpreter needs.

    `connection` is what `exec_start(..., socket=True)` returned. A thread reads the socket
    until the stream ends; `stop()` ends it from this side and closes the socket (only the
    caller's thread ever closes it, so no send can reach a reused descriptor).
    """

    def __init__(self, connection) -> None:
        self._connection = connection
        self._socket: socket.socket = getattr(connection, "_sock", connection)
        self._socket.settimeout(None)  # the reader thread blocks; the docker client's timeout would end it when idle
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", SEND_TIMEOUT_S, 0))
        read_fd, self._stdout_write_fd = os.pipe()
        self.stdin = _SocketStdin(self._socket)
        self.stdout = os.fdopen(read_fd, "rb", buffering=0)
        self.stderr = None
        self.stderr_head = bytearray()
        self.returncode: int | None = None
        self._reader = threading.Thread(target=self._copy_stream, name="docker-warm-stream", daemon=True)
        self._reader.start()

    def poll(self) -> int | None:
        """None while the exec's stream is open; then -1 (docker has the exit code, not the stream)."""
        return self.returncode

    def stop(self) -> None:
        """End the stream from this side (the command reads end of input), end the thread, close the socket."""
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.stdout.close()  # a reader thread blocked on a full pipe gets EPIPE
        self._reader.join(timeout=STOP_WAIT_S)
        self._connection.close()
        self._socket.close()

    def _copy_stream(self) -> None:
        splitter = FrameSplitter()
        try:
            while data := self._socket.recv(1 << 16):
                for stream, piece in splitter.feed(data):
                    self._deliver(stream, piece)
        except OSError:  # the socket was shut down, or the pipe's reader went away
            pass
        finally:
            self.returncode = -1
            os.close(self._stdout_write_fd)

    def _deliver(self, stream: int, piece: bytes) -> None:
        if stream == 2:
            self.stderr_head += piece[: max(0, STDERR_KEPT - len(self.stderr_head))]
            return
        view = memoryview(piece)
        while view:
            view = view[os.write(self._stdout_write_fd, view):]
