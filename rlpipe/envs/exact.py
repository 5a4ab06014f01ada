"""Shared pieces of the exact-answer domains (arithmetic, reverse): the verifier, the
held-out/train split rule, and the verifier version hash.

What it does:
- `verify_exact` compares the completion, stripped of surrounding whitespace, with the
  expected answer, character for character (no Unicode normalisation: a fullwidth "９５" is
  not "95"). It returns a Verdict and never raises: 1.0/ok on a match; 0.0/format when the
  output is empty, longer than `max_answer_chars`, or holds more than one whitespace-
  separated field (several answers, an answer with extra text); 0.0/wrong otherwise.
  `detail` is at most DETAIL_CHARS characters, whatever the model wrote (1 MB is fine).
- `in_heldout` assigns a problem to the held-out split by a hash of its canonical key, so
  train and held-out are disjoint for every seed and every split size.
- `source_version` hashes verifier source code and parameters into a verifier_version.

What it does not: parse numbers (" 95.0" is wrong for "95"), run code, or need a sandbox.
"""

from __future__ import annotations

import hashlib
import random
import inspect
import time
from collections.abc import Sequence
from types import ModuleType
from typing import TypeVar

from rlpipe.core.records import Verdict, VerdictReason

T = TypeVar("T")

DETAIL_CHARS = 200
MAX_ANSWER_CHARS = 1000
EXACT_KIND = "exact"


def verify_exact(completion_text: str, expected: str, verifier_version: str, max_answer_chars: int = MAX_ANSWER_CHARS) -> Verdict:
    """Reward 1.0 iff the stripped completion equals `expected`; see the module docstring."""
    started = time.perf_counter()
    try:
        reason, detail = _judge(completion_text, expected, max_answer_chars)
    except Exception as exc:  # a verifier never raises for model output
        reason, detail = VerdictReason.FORMAT, f"unreadable output: {type(exc).__name__}"
    passed = reason is VerdictReason.OK
    return Verdict(
        reward=1.0 if passed else 0.0,
        passed=passed,
        reason=reason,
        detail=detail[:DETAIL_CHARS],
        duration_s=time.perf_counter() - started,
        verifier_version=verifier_version,
    )


def _judge(completion_text: str, expected: str, max_answer_chars: int) -> tuple[VerdictReason, str]:
    text = completion_text if isinstance(completion_text, str) else str(completion_text)
    if len(text) > 4 * max_answer_chars:  # do not strip or split megabytes
        return VerdictReason.FORMAT, f"output too long: {len(text)} chars"
    answer = text.strip()
    if answer == expected:
        return VerdictReason.OK, "ok"
    if not answer:
        return VerdictReason.FORMAT, "empty output"
    if len(answer) > max_answer_chars:
        return VerdictReason.FORMAT, f"output too long: {len(answer)} chars"
    if len(answer.split()) > 1:
        return VerdictReason.FORMAT, f"expected one answer {expected!r}, got several fields: {_preview(answer)}"
    return VerdictReason.WRONG, f"expected {expected!r}, got {_preview(answer)}"


def _preview(text: str, chars: int = 80) -> str:
    return repr(text[:chars]) + ("..." if len(text) > chars else "")


def in_heldout(key: str, heldout_fraction: float) -> bool:
    """True when the problem with canonical `key` belongs to the held-out split (seed-free)."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < heldout_fraction


def source_version(modules: tuple[ModuleType, ...], params: tuple[tuple[str, object], ...]) -> str:
    """A short hash of the modules' source and the verifier parameters."""
    hasher = hashlib.sha256()
    for module in modules:
        hasher.update(inspect.getsource(module).encode("utf-8"))
    hasher.update(repr(params).encode("utf-8"))
    return hasher.hexdigest()[:12]


def draw_from_pool(pool: Sequence[T], count: int, rng: random.Random) -> list[T]:
    """`count` items of `pool`, distinct while it has enough (then a fresh round), drawn with `rng`."""
    chosen: list[T] = []
    while len(chosen) < count:
        chosen.extend(rng.sample(pool, min(len(pool), count - len(chosen))))
    return chosen


def check_split(split: str) -> None:
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
