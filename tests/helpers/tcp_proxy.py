"""A TCP proxy on 127.0.0.1 that can cut every connection and refuse new ones for a while,
for tests of storage outages (the pipeline talks to S3 through it).

What it does: listens on a free loopback port and pipes each accepted connection to the
target with two threads. `refuse()` stops listening (new connections are refused:
ECONNREFUSED) and shuts down every open connection (the client sees a reset or EOF
mid-request); `restore()` listens again on the same port. `blackhole()` instead keeps
accepting connections but never forwards a byte (the client waits for its own timeouts);
`held` counts those connections, the evidence that a client was made to wait. `stop()`
refuses for good. What it does not: speak HTTP, or simulate slow links.
"""

from __future__ import annotations

import socket
import threading
import time

from tests.helpers.ports import free_port


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.accepted = 0
        self.held = 0  # connections accepted while blackholed (the client had to wait them out)
        self.events: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._blackhole = False

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept_loop, args=(listener,), daemon=True).start()
        return self

    def refuse(self) -> None:
        """Refuse new connections and drop every open one."""
        self.events.append((time.monotonic(), "refuse"))
        self._close_listener()
        self._drop_open()

    def blackhole(self) -> None:
        """Drop every open connection; accept new ones but never answer."""
        self.events.append((time.monotonic(), "blackhole"))
        self._blackhole = True
        self._drop_open()

    def restore(self) -> None:
        self.events.append((time.monotonic(), "restore"))
        self._blackhole = False
        self._drop_open()  # blackholed connections end (the client retries on a fresh one)
        if self._listener is None:
            self.start()

    def stop(self) -> None:
        self._close_listener()
        self._drop_open()

    def _close_listener(self) -> None:
        # close() alone would leave the socket listening while the accept thread is blocked
        # in accept() (it holds a reference), letting one more connection through;
        # shutdown() ends the listen state and wakes accept() at once.
        listener, self._listener = self._listener, None
        if listener is None:
            return
        try:
            listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        listener.close()

    def _drop_open(self) -> None:
        with self._lock:
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by refuse() or stop()
            self.accepted += 1
            if self._blackhole:
                self.held += 1
                with self._lock:
                    self._open.add(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
            with self._lock:
                self._open.discard(source)
                self._open.discard(sink)
