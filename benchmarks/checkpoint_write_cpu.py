"""Where a checkpoint write's CPU goes, without a model: `nice -n 19 .venv/bin/python
benchmarks/checkpoint_write_cpu.py [--parameters 134515008] [--reps 3] [--profile]`.

Builds tensors of a checkpoint's shape for a model of `--parameters` float32 parameters
(SmolLM2-135M's count by default): the weights as model.safetensors' tensors, and a trainer
state with AdamW's two moments of each (what optimizer.pt holds), 16 tensors each, then
writes them as rlpipe writes a checkpoint (rl/checkpoint_contents.py `write_contents` into a
temporary local lake's CheckpointStore: streamed, digested, fsynced, committed), once per
digest algorithm of storage/digests.py and repetition, alternating. For each write it prints
the wall seconds, the writing thread's CPU seconds (user and kernel: getrusage of the
thread) and, inside them, the CPU of the digest alone (the same bytes through the same
hasher, timed apart) and of fsync (with `--drop-cache`, fsync then dropping the file's pages).
`--buffered` writes through the page cache as rlpipe did before O_DIRECT
(storage/direct_file.py). `--keep K` keeps the last K checkpoints (as retention does) so that their pages stay in the
page cache as in a run. With `--profile`, cProfile's top functions (by the thread's CPU) of
the last repetition's writes.

What it does not: build a model or a trainer (the tensors are random), measure the kernel's
writeback (not CPU of the thread), or compete with anything (benchmarks/checkpoint_memory.py
writes beside real updates).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import os
import pstats
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import rlpipe.storage.checkpoint_store as checkpoint_store  # noqa: E402
from rlpipe.rl.checkpoint_contents import CheckpointContents, CheckpointMeta, write_contents  # noqa: E402
from rlpipe.storage.digests import ALGORITHMS, new_hasher  # noqa: E402
from rlpipe.storage.direct_file import DirectFile  # noqa: E402
from rlpipe.storage.lake import Lake  # noqa: E402

PIECES = 16


class _Timed:
    """The thread CPU of os.fsync in the current write."""

    fsync_cpu = 0.0


def _contents(parameters: int) -> CheckpointContents:
    size = parameters // PIECES
    weights = [(f"layer{index}.weight", torch.randn(size)) for index in range(PIECES)]
    state = {"optimizer": {"state": {index: {"step": torch.tensor(3.0), "exp_avg": torch.randn(size), "exp_avg_sq": torch.rand(size)}
                                     for index in range(PIECES)},
                           "param_groups": [{"lr": 1e-5, "params": list(range(PIECES))}]}}
    return CheckpointContents(meta=CheckpointMeta(1, 1, "bench"), weights=weights, trainer_state=state, adapter=None,
                              small_files={"rlpipe_checkpoint.json": b"{}"})


def _digest_cpu(lake: Lake, info, algorithm: str) -> float:
    """Thread CPU of digesting the checkpoint's files again with `algorithm` (page cache hot)."""
    spent = 0.0
    for file in info.files:
        data = Path(lake.location.path(f"{lake.checkpoints.folder(info.run_id, info.step)}/{file.path}")).read_bytes()
        began = time.thread_time()
        hasher = new_hasher(algorithm)
        view = memoryview(data)
        for start in range(0, len(view), 16 * 1024 * 1024):
            hasher.update(view[start:start + 16 * 1024 * 1024])
        hasher.hexdigest()
        spent += time.thread_time() - began
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parameters", type=int, default=134_515_008)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--buffered", action="store_true", help="write through the page cache (no O_DIRECT), to compare")
    parser.add_argument("--keep", type=int, default=0, help="keep the last K checkpoints (as retention does) instead of deleting each")
    parser.add_argument("--drop-cache", action="store_true", help="after each file's fsync, drop its pages from the page cache "
                        "(posix_fadvise DONTNEED), for comparison")
    args = parser.parse_args()
    if args.buffered:
        checkpoint_store.DirectFile = functools.partial(DirectFile, direct=False)
    contents = _contents(args.parameters)
    print(f"{contents.size_bytes / 1e9:.2f} GB of tensors ({args.parameters:,} float32 parameters, weights + 2 moments)")
    real_fsync = os.fsync

    def timed_fsync(fd: int) -> None:
        began = time.thread_time()
        real_fsync(fd)
        if args.drop_cache:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        _Timed.fsync_cpu += time.thread_time() - began

    os.fsync = timed_fsync  # checkpoint_store calls os.fsync(target.fileno()) on each file
    profile = cProfile.Profile(time.thread_time) if args.profile else None  # CPU, not wall
    with tempfile.TemporaryDirectory(prefix="rlpipe-ckpt-cpu-", dir=os.environ.get("TMPDIR")) as folder:
        lake = Lake.open(str(Path(folder) / "lake"))
        step = 0
        for rep in range(args.reps):
            for algorithm in sorted(ALGORITHMS):
                step += 1
                checkpoint_store.CHECKPOINT_DIGEST = algorithm
                _Timed.fsync_cpu = 0.0
                began, began_usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD)
                if profile is not None and rep == args.reps - 1:
                    profile.enable()
                writing = lake.checkpoints.begin("bench", step)
                write_contents(contents, writing.open)
                info = writing.commit()
                if profile is not None:
                    profile.disable()
                usage = resource.getrusage(resource.RUSAGE_THREAD)
                wall = time.perf_counter() - began
                user, system = usage.ru_utime - began_usage.ru_utime, usage.ru_stime - began_usage.ru_stime
                digest = _digest_cpu(lake, info, algorithm)
                print(f"  rep {rep + 1} {algorithm:9s}: {wall:5.2f} s wall, {user + system:5.2f} CPU s of the thread "
                      f"(user {user:.2f}, kernel {system:.2f}): the digest alone {digest:.2f}, fsync {_Timed.fsync_cpu:.2f}")
                if step > args.keep:
                    lake.checkpoints.delete("bench", step - args.keep)
    os.fsync = real_fsync
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
