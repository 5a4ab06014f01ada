"""The arithmetic domain: "37+58=" -> "95", checked by exact match.

What it does: enumerates every problem `a <op> b` with operands in [0, max_operand] and
operators from `operations`, assigns each to the train or held-out split by a hash of its
text (so the splits are disjoint for any seed and size), and draws seeded samples from a
split. The oracle answer is `Task.reference_answer` and the verifier payload.

What it does not: division, negative operands, or multi-step expressions.
"""

from __future__ import annotations

import random
import sys

from rlpipe.core.records import Task, Verdict, VerifierSpec
from rlpipe.envs import exact
from rlpipe.envs.exact import EXACT_KIND, check_split, draw_from_pool, in_heldout, source_version, verify_exact
from rlpipe.sandbox.base import Sandbox

_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithmeticEnv:
    """Integer arithmetic with exact-answer rewards."""

    name = "arithmetic"
    needs_sandbox = False

    def __init__(self, max_operand: int = 99, operations: str = "+", heldout_fraction: float = 0.2) -> None:
        if max_operand < 1:
            raise ValueError(f"max_operand must be >= 1, got {max_operand}")
        if not operations or any(op not in _APPLY for op in operations):
            raise ValueError(f"operations must be a non-empty string of {''.join(_APPLY)}, got {operations!r}")
        if not 0 < heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        self.max_operand = max_operand
        self.operations = operations
        self.heldout_fraction = heldout_fraction
        self.verifier_version = source_version(
            (exact, sys.modules[__name__]),
            (("max_operand", max_operand), ("operations", operations), ("heldout_fraction", heldout_fraction)),
        )
        problems = [(a, op, b) for op in dict.fromkeys(operations) for a in range(max_operand + 1) for b in range(max_operand + 1)]
        self._splits: dict[str, list[tuple[int, str, int]]] = {"train": [], "heldout": []}
        for a, op, b in problems:
            self._splits["heldout" if in_heldout(f"{a}{op}{b}", heldout_fraction) else "train"].append((a, op, b))

    def split_size(self, split: str) -> int:
        """How many distinct problems the split holds."""
        check_split(split)
        return len(self._splits[split])

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        """`count` tasks of the split, distinct while the split has enough (then repeating), seeded."""
        check_split(split)
        pool = self._splits[split]
        rng = random.Random(f"{self.name}:{split}:{seed}")
        return [self._task(a, op, b, split) for a, op, b in draw_from_pool(pool, count, rng)]

    def verify(self, task: Task, completion_text: str, sandbox: Sandbox | None = None) -> Verdict:
        return verify_exact(completion_text, task.verifier.payload, self.verifier_version)

    def _task(self, a: int, op: str, b: int, split: str) -> Task:
        answer = str(_APPLY[op](a, b))
        return Task(
            task_id=f"{self.name}/{a}{op}{b}",
            domain=self.name,
            prompt=f"{a}{op}{b}=",
            verifier=VerifierSpec(kind=EXACT_KIND, payload=answer),
            reference_answer=answer,
            metadata=(("split", split),),
        )
