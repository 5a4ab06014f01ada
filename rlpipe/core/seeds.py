"""Seeds derived from (run seed, step, purpose), so that what a step samples does not
depend on what ran before it in the same process (a resumed run samples the same)."""

from __future__ import annotations

import hashlib


def derive_seed(run_seed: int, step: int, purpose: str) -> int:
    """A 31-bit seed that depends only on its arguments."""
    digest = hashlib.sha256(f"{run_seed}/{step}/{purpose}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
