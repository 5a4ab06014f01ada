"""A write-only local file that bypasses the page cache (O_DIRECT), for checkpoint files.

Writing a 1.6 GB checkpoint through the page cache costs its thread several kernel CPU
seconds on this machine (each page allocated, copied into and accounted for, then written
back), against a few tenths with O_DIRECT (docs/RESULTS.md, issue 38:
benchmarks/file_write_cpu.py), and it leaves 1.6 GB of cached pages that nothing reads
again soon. `DirectFile` copies what it is given into one page-aligned bounce buffer of
`BUFFER_BYTES` and writes it whole with O_DIRECT (offsets, lengths and the buffer aligned
as the kernel requires); `close` writes the tail padded to a block, truncates the file back
to the bytes written, fsyncs and closes. Where O_DIRECT is refused (tmpfs and some FUSE
filesystems: EINVAL at open or at the first write) it goes on as a plain buffered file: the
bytes are the same either way.

What it does not: read, seek, digest (storage/checkpoint_store.py digests what passes
through), or help on S3 (the lake's remote streams are pyarrow's).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os

BUFFER_BYTES = 16 * 1024 * 1024
BLOCK_BYTES = 4096  # O_DIRECT alignment: a multiple of every logical block size in use


class DirectFile:
    """`write(bytes-like)`, then `close()` (fsynced); `direct` says whether O_DIRECT is used
    (`direct=False`: a plain buffered file, the same bytes, for comparison)."""

    def __init__(self, path: str, buffer: mmap.mmap | None = None, direct: bool = True) -> None:
        self._buffer = buffer if buffer is not None else new_buffer()
        if len(self._buffer) % BLOCK_BYTES:
            raise ValueError(f"the bounce buffer must be a multiple of {BLOCK_BYTES} bytes, not {len(self._buffer)}")
        self._view = memoryview(self._buffer)
        self._filled = 0
        self.size_bytes = 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        self._fd, self.direct = -1, direct
        if direct:
            try:
                self._fd = os.open(path, flags | os.O_DIRECT, 0o644)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct = False
        if not self.direct:
            self._fd = os.open(path, flags, 0o644)

    def write(self, data) -> int:
        source = memoryview(data).cast("B")
        done = 0
        while done < len(source):
            take = min(len(source) - done, len(self._view) - self._filled)
            self._view[self._filled:self._filled + take] = source[done:done + take]
            self._filled += take
            done += take
            if self._filled == len(self._view):
                self._drain(self._filled)
        self.size_bytes += done
        return done

    def flush(self) -> None:
        """Nothing: whole buffers are written as they fill, the tail by `close`."""

    def close(self) -> None:
        """Write the tail, set the file's size to the bytes written, fsync, close."""
        if self._fd < 0:
            return
        try:
            if self._filled:
                self._drain(-(-self._filled // BLOCK_BYTES) * BLOCK_BYTES if self.direct else self._filled)
            os.ftruncate(self._fd, self.size_bytes)
            os.fsync(self._fd)
        finally:
            self.discard()

    def discard(self) -> None:
        """Close without writing what is buffered (a failed write: the file is partial)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def fileno(self) -> int:
        return self._fd

    def _drain(self, length: int) -> None:
        """Write the buffer's first `length` bytes (past `_filled`: padding, cut by close)."""
        written = 0
        while written < length:
            try:
                written += os.write(self._fd, self._view[written:length])
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                self._buffered_from_now()  # the filesystem took the open but refuses the write
        self._filled = 0

    def _buffered_from_now(self) -> None:
        fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        self.direct = False


def new_buffer() -> mmap.mmap:
    """A page-aligned bounce buffer of BUFFER_BYTES (reuse it across the files of a checkpoint)."""
    return mmap.mmap(-1, BUFFER_BYTES)
