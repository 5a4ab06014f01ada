"""A worker gives freed heap memory back once it idles between requests
(workers/server.return_freed_memory): glibc keeps freed chunks of its heap, so a worker that
freed its last request's tensors would otherwise keep their pages while it waits; requests
that follow one another at once keep them (faulting them in again each time costs more)."""

import ctypes
import platform
import threading
from multiprocessing.connection import Client, Listener

import pytest
import torch

from rlpipe.workers import server
from rlpipe.workers.protocol import Accepted, Ok, Stop
from rlpipe.workers.server import return_freed_memory

MB = 1024 * 1024


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim")
def test_freed_tensors_pages_are_returned():
    mallopt = ctypes.CDLL(None).mallopt
    mallopt(-3, 64 * MB)  # M_MMAP_THRESHOLD: 4 MB tensors from the heap, as after a run's first frees raised it
    try:
        tensors = [torch.ones(MB) for _ in range(60)]  # 60 x 4 MB
        kept = tensors[::10]
        del tensors  # 54 freed chunks between kept ones: the heap cannot shrink from its top
        before = resident_bytes()
        return_freed_memory()
        after = resident_bytes()
        assert before - after > 150 * MB, (before, after)
        assert all(float(tensor[0]) == 1.0 for tensor in kept)
    finally:
        mallopt(-3, 128 * 1024)  # the default threshold (glibc then adjusts it dynamically again)


class _Echo:
    poisoned = False

    def handle(self, request: object) -> object:
        return request


def test_a_worker_trims_once_it_waits_for_its_next_request_not_between_back_to_back_ones(tmp_path, monkeypatch):
    trimmed = threading.Event()
    trims: list[int] = []

    def record_trim() -> None:
        trims.append(1)
        trimmed.set()

    monkeypatch.setattr(server, "return_freed_memory", record_trim)
    monkeypatch.setattr(server, "TRIM_AFTER_IDLE_S", 600.0)  # phase 1: no wait between requests comes near it
    address = str(tmp_path / "worker.sock")
    listener = Listener(address, family="AF_UNIX", authkey=b"key")
    serving = threading.Thread(target=server.serve, args=(listener, _Echo()), daemon=True)
    serving.start()

    def call(request: object) -> object:
        client.send(request)
        assert isinstance(client.recv(), Accepted)
        return client.recv()

    with Client(address, family="AF_UNIX", authkey=b"key") as client:
        assert [call(n) for n in range(3)] == [Ok(0), Ok(1), Ok(2)]
        assert trims == []
        monkeypatch.setattr(server, "TRIM_AFTER_IDLE_S", 0.01)  # read by the wait after the next reply
        assert call("last") == Ok("last")
        assert trimmed.wait(60), "the idle worker never returned its freed memory"
        assert call(Stop()) == Ok(None)
    serving.join(60)
    assert not serving.is_alive() and trims == [1]
    listener.close()
