"""A worker gives freed heap memory back between requests (workers/server.return_freed_memory):
glibc keeps freed chunks of its heap, so a worker that freed its last request's tensors would
otherwise keep their pages while it waits."""

import ctypes
import platform

import pytest
import torch

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
