"""The Env protocol: a domain gives seeded train/held-out tasks and verifies answers.

An env never imports prefect, mlflow or storage clients. Verifiers are pure functions of
(task, completion text[, sandbox]) that return a Verdict and never raise for anything the
model wrote: bad model output is a verdict (reason=format/wrong), not an exception.
"""

from __future__ import annotations

from typing import Protocol

from rlpipe.core.records import Task, Verdict
from rlpipe.sandbox.base import Sandbox


class Env(Protocol):
    name: str
    needs_sandbox: bool
    verifier_version: str

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        """`count` tasks of split "train" or "heldout" (disjoint), the same for the same seed."""
        ...

    def verify(self, task: Task, completion_text: str, sandbox: Sandbox | None = None) -> Verdict: ...
