"""The digests of checkpoint files: which algorithms a CHECKPOINT.json may name, and a
hasher for each.

A checkpoint file's digest detects damage (a truncated or altered byte, a file swapped for
another) between its write and its read; it is not a signature: whoever can rewrite a file
in the lake can rewrite CHECKPOINT.json beside it, whatever the algorithm (rl/checkpoint.py
refuses a trainer file that would run code for that reason). So checkpoints are digested
with `CHECKPOINT_DIGEST`, xxHash's XXH3 with 128 bits (~10x faster than sha256 on this
machine's CPUs, about a tenth of a CPU second for a 1.6 GB SmolLM2 checkpoint where sha256
took one second: docs/RESULTS.md, issue 38), whose chance of missing a random change is
2**-128. Checkpoints written before it record sha256, and are read and checked with it:
each CheckpointFile names its algorithm by the field that holds its digest
(storage/lake_records.py).

What it does not: digest Parquet parts, staged rows or anything else of the lake (they keep
sha256: they are small), or read files (storage/checkpoint_store.py, storage/objects.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Protocol

import xxhash


class Hasher(Protocol):
    def update(self, data, /) -> None: ...

    def hexdigest(self) -> str: ...


ALGORITHMS: dict[str, Callable[[], Hasher]] = {
    "sha256": hashlib.sha256,
    "xxh3_128": xxhash.xxh3_128,
}
CHECKPOINT_DIGEST = "xxh3_128"  # what new checkpoints record


def new_hasher(algorithm: str) -> Hasher:
    """A fresh hasher of `algorithm` (one of ALGORITHMS); ValueError names the known ones."""
    try:
        return ALGORITHMS[algorithm]()
    except KeyError:
        raise ValueError(f"unknown digest algorithm {algorithm!r}; known: {', '.join(sorted(ALGORITHMS))}") from None
