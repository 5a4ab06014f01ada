"""storage/direct_file.py: the bytes written with O_DIRECT (or, where it is refused, without)
are exactly the bytes given, whatever the sizes of the writes and of the file."""

from __future__ import annotations

import errno
import mmap
import os
import random
from pathlib import Path

import pytest

from rlpipe.storage import direct_file
from rlpipe.storage.direct_file import DirectFile

SIZES = [0, 1, 4095, 4096, 4097, 8192, 3 * 8192 + 5, 100_000]


def _write(path: Path, data: bytes, seed: int, direct: bool = True) -> DirectFile:
    """Write `data` in pieces of random sizes (some larger than the 8 KiB buffer)."""
    file = DirectFile(str(path), mmap.mmap(-1, 8192), direct=direct)
    pieces, rng, at = [], random.Random(seed), 0
    while at < len(data):
        size = rng.choice([1, 7, 4096, 5000, 20_000])
        pieces.append(data[at:at + size])
        at += size
    for piece in pieces:
        assert file.write(memoryview(piece)) == len(piece)
    file.close()
    return file


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("size", SIZES)
def test_the_file_holds_exactly_the_bytes_written(tmp_path: Path, size: int, direct: bool) -> None:
    data = random.Random(size).randbytes(size)
    file = _write(tmp_path / "f.bin", data, seed=size, direct=direct)
    assert (tmp_path / "f.bin").read_bytes() == data and file.size_bytes == size
    file.close()  # closing again does nothing


def test_a_filesystem_that_refuses_o_direct_at_open_gets_a_plain_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def refusing_open(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "O_DIRECT refused")
        return real_open(path, flags, *args)

    monkeypatch.setattr(direct_file.os, "open", refusing_open)
    data = random.Random(1).randbytes(30_001)
    file = _write(tmp_path / "f.bin", data, seed=1)
    assert not file.direct and (tmp_path / "f.bin").read_bytes() == data


def test_a_filesystem_that_refuses_an_o_direct_write_goes_on_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write, refused = os.write, []

    def refusing_write(fd, data):
        if not refused:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "O_DIRECT write refused")
        return real_write(fd, data)

    monkeypatch.setattr(direct_file.os, "write", refusing_write)
    data = random.Random(2).randbytes(50_000)
    file = _write(tmp_path / "f.bin", data, seed=2)
    assert refused and not file.direct and (tmp_path / "f.bin").read_bytes() == data


def test_a_full_disk_is_raised_not_swallowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct_file.os, "write", full)
    file = DirectFile(str(tmp_path / "f.bin"), mmap.mmap(-1, 8192))
    with pytest.raises(OSError) as raised:
        file.write(b"x" * 9000)
    assert raised.value.errno == errno.ENOSPC
    file.discard()


def test_a_buffer_that_is_not_whole_blocks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="multiple of 4096"):
        DirectFile(str(tmp_path / "f.bin"), mmap.mmap(-1, 5000))
