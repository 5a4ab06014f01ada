"""What writing bytes that are already in memory to a local file costs the writing thread,
through the page cache or around it: `nice -n 19 .venv/bin/python benchmarks/file_write_cpu.py
[--gib 1.6] [--reps 3] [--dir FOLDER]`.

Fills a buffer of `--gib` GiB (as a checkpoint's tensors are: resident, written once), then,
alternating per repetition, writes it to a file in `--dir` in 16 MiB pieces and fsyncs it:
`buffered` (plain write calls: the kernel copies each page into the page cache, writeback
later; what checkpoint files went through before) and `direct` (rlpipe's own writer,
storage/direct_file.py, which checkpoint files go through now: O_DIRECT from a page-aligned
16 MiB bounce buffer straight to the device, no page cache, the file's tail padded to 4 KiB
and truncated back). Prints each write's wall seconds and the thread's user and kernel CPU
seconds (getrusage).

What it does not: digest or serialize (benchmarks/checkpoint_write_cpu.py), or work where
O_DIRECT is refused (EINVAL: reported, the write goes buffered).
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import tempfile
import time

from rlpipe.storage.direct_file import BUFFER_BYTES, DirectFile, new_buffer

PIECE = BUFFER_BYTES


def _buffered(path: str, data: memoryview) -> bool:
    with open(path, "wb") as target:
        for start in range(0, len(data), PIECE):
            target.write(data[start:start + PIECE])
        target.flush()
        os.fsync(target.fileno())
    return False


def _direct(path: str, data: memoryview, bounce: mmap.mmap) -> bool:
    """rlpipe's own O_DIRECT writer (storage/direct_file.py); whether O_DIRECT held."""
    target = DirectFile(path, bounce)
    try:
        for start in range(0, len(data), PIECE):
            target.write(data[start:start + PIECE])
        target.close()
    finally:
        target.discard()
    return target.direct


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.6)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None, help="folder on the disk to test (default: the temp folder)")
    args = parser.parse_args()
    data = bytearray(os.urandom(1024 * 1024)) * int(args.gib * 1024)  # resident, like a checkpoint's tensors
    view = memoryview(data)
    bounce = new_buffer()  # page-aligned, what O_DIRECT needs
    print(f"{len(data) / 1e9:.2f} GB from memory, {PIECE >> 20} MiB pieces")
    with tempfile.TemporaryDirectory(prefix="rlpipe-write-cpu-", dir=args.dir) as folder:
        for rep in range(args.reps):
            for mode in ("buffered", "direct"):
                path = os.path.join(folder, f"{mode}.bin")
                began, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD)
                if (_buffered(path, view) if mode == "buffered" else _direct(path, view, bounce)) != (mode == "direct"):
                    print(f"  rep {rep + 1} {mode}: O_DIRECT refused here (EINVAL); written buffered")
                    continue
                after = resource.getrusage(resource.RUSAGE_THREAD)
                if os.path.getsize(path) != len(data):
                    raise SystemExit(f"{mode} wrote {os.path.getsize(path)} bytes, not {len(data)}")
                print(f"  rep {rep + 1} {mode:8s}: {time.perf_counter() - began:5.2f} s wall, user "
                      f"{after.ru_utime - usage.ru_utime:.2f} CPU s, kernel {after.ru_stime - usage.ru_stime:.2f} CPU s")
                os.unlink(path)


if __name__ == "__main__":
    main()
