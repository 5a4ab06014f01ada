"""The state a trial can be replayed from: a digest of /work after each step, and the
recorded steps a replay re-executes.

Replay (`rlpipe eval replay TRIAL --from-step K`, agents/replay.py) restores the state after
step K by RE-EXECUTING the recorded tool calls 1..K in a fresh sandbox set up from the task's
initial state, not from stored snapshots: a sandbox snapshot (rlpipe/sandbox) is an opaque
handle that lives only as long as the runtime that took it (bwrap: a copy under its runtime
root; docker: inside the container), so keeping one per step would mean copying every
step's tree into the lake. Re-execution needs only what every trial records anyway (the
calls), and is exact for deterministic commands only, so each step also records
`tree_digest` of /work (one small Python exec in the sandbox per step); a replay compares
the digest after each re-executed step with the recorded one and refuses (ReplayDiverged)
at the first mismatch, e.g. a command that wrote the date or a random number.

The digest covers every path under /work (sorted), its type, its permission bits, a file's
bytes and a link's target; not times, owners or anything outside /work.
What it does not do: run the replay (agents/trial.py re-executes, agents/replay.py drives it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

from rlpipe.agents.records import TrialStep
from rlpipe.core.errors import UserError
from rlpipe.sandbox.base import Sandbox

TREE_DIGEST_TIMEOUT_S = 30.0
TREE_DIGEST_PROGRAM = "tree_digest_program.py"


@cache
def _tree_digest_source() -> str:
    """The text of agents/tree_digest_program.py (package data: works from a wheel too)."""
    return resources.files("rlpipe.agents").joinpath(TREE_DIGEST_PROGRAM).read_text(encoding="utf-8")


def tree_digest(sandbox: Sandbox) -> str | None:
    """sha256 of /work's paths, types, modes and contents; None when it could not be taken."""
    ran = sandbox.exec_python(_tree_digest_source(), timeout_s=TREE_DIGEST_TIMEOUT_S)
    text = ran.stdout.strip()
    return text if ran.exit_code == 0 and len(text) == 64 else None


class ReplayDiverged(UserError):
    """Re-executing a recorded step did not give the recorded /work: the trial cannot be replayed."""


@dataclass(frozen=True)
class ReplayPrefix:
    """The first `len(steps)` recorded steps of trial `source_trial_id`, to re-execute before
    the new agent takes over (each well-formed non-submit call is run again; a malformed
    reply is shown to the agent again with its recorded error)."""

    source_trial_id: str
    steps: tuple[TrialStep, ...]
