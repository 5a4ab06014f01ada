"""The reverse domain: "reverse abc=" -> "cba", checked by exact match.

What it does: draws random lowercase words of min_word_len..max_word_len letters, assigns
each word to the train or held-out split by a hash of the word (disjoint for any seed), and
returns seeded, distinct samples of a split. The oracle answer is the reversed word.

What it does not: real dictionary words, or spaces and punctuation inside a word.
"""

from __future__ import annotations

import random
import string
import sys

from rlpipe.core.records import Task, Verdict, VerifierSpec
from rlpipe.envs import exact
from rlpipe.envs.exact import EXACT_KIND, check_split, in_heldout, source_version, verify_exact
from rlpipe.sandbox.base import Sandbox


class ReverseEnv:
    """Reverse a word, with exact-answer rewards."""

    name = "reverse"
    needs_sandbox = False

    def __init__(self, max_word_len: int = 6, min_word_len: int = 3, heldout_fraction: float = 0.2) -> None:
        if not 1 <= min_word_len <= max_word_len:
            raise ValueError(f"need 1 <= min_word_len <= max_word_len, got {min_word_len}, {max_word_len}")
        if not 0 < heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        self.max_word_len = max_word_len
        self.min_word_len = min_word_len
        self.heldout_fraction = heldout_fraction
        self.verifier_version = source_version(
            (exact, sys.modules[__name__]),
            (("max_word_len", max_word_len), ("min_word_len", min_word_len), ("heldout_fraction", heldout_fraction)),
        )

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        """`count` distinct words of the split (distinct while the word space allows), seeded."""
        check_split(split)
        rng = random.Random(f"{self.name}:{split}:{seed}")
        want_heldout = split == "heldout"
        seen: set[str] = set()
        words: list[str] = []
        attempts = 0
        while len(words) < count:
            attempts += 1
            length = rng.randint(self.min_word_len, self.max_word_len)
            word = "".join(rng.choice(string.ascii_lowercase) for _ in range(length))
            if in_heldout(word, self.heldout_fraction) != want_heldout:
                continue
            if word in seen and attempts < 100 * (count + 10):
                continue
            seen.add(word)
            words.append(word)
        return [self._task(word, split) for word in words]

    def verify(self, task: Task, completion_text: str, sandbox: Sandbox | None = None) -> Verdict:
        return verify_exact(completion_text, task.verifier.payload, self.verifier_version)

    def _task(self, word: str, split: str) -> Task:
        answer = word[::-1]
        return Task(
            task_id=f"{self.name}/{word}",
            domain=self.name,
            prompt=f"reverse {word}=",
            verifier=VerifierSpec(kind=EXACT_KIND, payload=answer),
            reference_answer=answer,
            metadata=(("split", split),),
        )
