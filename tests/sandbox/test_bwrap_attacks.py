"""One adversarial property per test for the bubblewrap backend (the suite in sandbox/selftest.py).

Each attack runs twice (a plain exec; exec_python, the warm path code verification uses) and
makes its own sandbox with small limits (128 MB, 32 processes, 16 MB disk), so
the host stays responsive; network checks only talk to a listener on this host's 127.0.0.1.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlpipe.sandbox.base import Limits
from rlpipe.sandbox.selftest import ATTACKS, PATHS, Attack, run_attack
from tests.sandbox._bwrap_support import require_bwrap

pytestmark = pytest.mark.bwrap


def make_bwrap(limits: Limits):
    from rlpipe.sandbox.bwrap import BwrapSandbox

    return BwrapSandbox(limits)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("attack", ATTACKS, ids=[attack.guarantee for attack in ATTACKS])
def test_guarantee_holds(attack: Attack, path: str):
    """Each attack with its programs run by a plain exec, and by exec_python (the warm interpreter)."""
    require_bwrap()
    outcome = run_attack(attack, make_bwrap, path)
    assert outcome.held, outcome.detail


def _processes_of_uid(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_no_process_dir_or_cgroup_outlives_its_sandbox():
    require_bwrap()
    from rlpipe.sandbox import attacks
    from rlpipe.sandbox.bwrap import BwrapSandbox

    sandbox = BwrapSandbox(Limits(timeout_s=1.0))
    sandbox.exec(["python3", "-c", attacks.DOUBLE_FORK])
    sandbox.exec(["python3", "-c", attacks.FORK_BOMB], timeout_s=1.0)
    sandbox.exec(["python3", "-c", attacks.SLEEP_FOREVER], timeout_s=0.5)
    uid, directory, cgroups = sandbox.host_uid, sandbox.dir, sandbox.cgroups
    sandbox.close()
    assert not directory.exists()
    if os.geteuid() == 0:  # otherwise the uid is ours and shared with this very process
        assert _processes_of_uid(uid) == []
    if cgroups is not None:
        cgroups.remove()  # close() leaves the removal of the emptied dirs to a background thread
        assert cgroups.pids() == [] and not cgroups.memory_dir.exists() and not cgroups.pids_dir.exists()
