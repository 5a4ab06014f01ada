"""SandboxPool: with a fake sandbox that implements the protocol, and with real bwrap sandboxes."""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from pathlib import Path

import pytest

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox.base import ExecResult, Limits, Snapshot
from rlpipe.sandbox.pool import SandboxPool, default_pool_size
from tests.helpers.waiting import HANG_GUARD_S
from tests.sandbox._bwrap_support import require_bwrap


class FakeSandbox:
    """In-memory files; `exec(["true"])` answers 0 unless made unhealthy."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.resets = 0
        self.closed = False
        self.healthy = True
        self.in_use = threading.Lock()

    def exec(self, argv: list[str], stdin: bytes = b"", timeout_s: float | None = None) -> ExecResult:
        code = 0 if self.healthy else 1
        return ExecResult(code, "", "", False, False, 0.0, False, False)

    def write_files(self, files: dict[str, bytes]) -> None:
        self.files.update(files)

    def read_file(self, path: str) -> bytes:
        return self.files[path]

    def snapshot(self) -> Snapshot:
        return Snapshot("fake")

    def restore(self, snapshot: Snapshot) -> None:
        pass

    def reset(self) -> None:
        self.files.clear()
        self.resets += 1

    def close(self) -> None:
        self.closed = True


def test_default_size_is_bounded_by_cores_and_memory():
    cores = len(os.sched_getaffinity(0))
    assert 1 <= default_pool_size(memory_mb_per_sandbox=256) <= cores
    assert default_pool_size(memory_mb_per_sandbox=10**9) == 1  # a petabyte each: memory allows one at most


def test_prewarms_size_sandboxes():
    made: list[FakeSandbox] = []
    with SandboxPool(lambda: made.append(FakeSandbox()) or made[-1], size=3) as pool:
        assert len(made) == 3 and pool.idle_count == 3


def test_a_returned_sandbox_is_reset():
    with SandboxPool(FakeSandbox, size=1) as pool:
        with pool.acquire() as sandbox:
            sandbox.write_files({"a": b"1"})
        with pool.acquire() as again:
            assert again is sandbox and again.files == {} and again.resets == 1


def test_acquire_times_out_when_all_are_lent():
    with SandboxPool(FakeSandbox, size=1) as pool:
        with pool.acquire():
            with pytest.raises(SandboxUnavailable, match="no sandbox free within 0.2 s"):
                with pool.acquire(timeout_s=0.2):
                    pass


def test_acquire_waits_for_a_lent_sandbox_and_gets_it_when_returned():
    with SandboxPool(FakeSandbox, size=1) as pool:
        waiting = threading.Event()
        pool._idle = _NotingQueue(pool._idle, waiting)
        got: list[FakeSandbox] = []
        with pool.acquire() as lent:
            waiting.clear()
            borrower = threading.Thread(target=lambda: got.append(_borrow(pool)))
            borrower.start()
            assert waiting.wait(timeout=HANG_GUARD_S), "the borrower never reached the idle queue"
            assert got == []  # it waits: the one sandbox is lent
        borrower.join(timeout=HANG_GUARD_S)
        assert got == [lent]  # and gets it once returned


class _NotingQueue:
    """The pool's idle queue, setting `waiting` whenever someone blocks on it (get)."""

    def __init__(self, inner, waiting: threading.Event) -> None:
        self._inner, self._waiting = inner, waiting

    def get(self, *args, **kwargs):
        self._waiting.set()
        return self._inner.get(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def _borrow(pool: SandboxPool) -> FakeSandbox:
    with pool.acquire(timeout_s=HANG_GUARD_S) as sandbox:
        return sandbox


def test_map_keeps_order_and_never_shares_a_sandbox():
    # the barrier holds every round's 3 users inside `use` together (so all 3 sandboxes are
    # lent at once, whatever the machine's load): a shared sandbox would be caught in use
    all_three_in_use = threading.Barrier(3, timeout=HANG_GUARD_S)

    def use(sandbox: FakeSandbox, item: int) -> int:
        assert sandbox.in_use.acquire(blocking=False), "two users at once"
        all_three_in_use.wait()
        sandbox.in_use.release()
        return item * item

    with SandboxPool(FakeSandbox, size=3) as pool:
        assert pool.map(use, range(21)) == [item * item for item in range(21)]  # 7 rounds of 3


def test_unhealthy_sandboxes_are_replaced():
    with SandboxPool(FakeSandbox, size=2) as pool:
        with pool.acquire() as sandbox:
            sandbox.healthy = False
        assert pool.check_idle() == 1 and sandbox.closed and pool.idle_count == 2


def test_a_sandbox_whose_user_hit_an_infra_error_is_replaced():
    with SandboxPool(FakeSandbox, size=1) as pool:
        with pytest.raises(SandboxUnavailable):
            with pool.acquire() as sandbox:
                raise SandboxUnavailable("daemon gone")
        assert sandbox.closed and pool.replaced == 1
        with pool.acquire() as fresh:
            assert fresh is not sandbox


def test_reaps_leaked_sandboxes_at_start():
    with SandboxPool(FakeSandbox, size=1, reap_leaked=lambda: 4) as pool:
        assert pool.reaped_at_start == 4


def test_close_closes_every_sandbox():
    made: list[FakeSandbox] = []
    pool = SandboxPool(lambda: made.append(FakeSandbox()) or made[-1], size=2)
    pool.close()
    assert all(sandbox.closed for sandbox in made)


@pytest.mark.bwrap
def test_bwrap_pool_resets_the_work_dir_between_uses():
    require_bwrap()
    from rlpipe.sandbox.bwrap import BwrapSandbox

    with SandboxPool(lambda: BwrapSandbox(Limits(timeout_s=5)), size=2) as pool:
        results = pool.map(lambda sandbox, item: sandbox.exec(["sh", "-c", f"ls; echo {item} > mine"]).stdout, range(6))
        assert results == [""] * 6  # `ls` in each use saw an empty /work


@pytest.mark.bwrap
def test_bwrap_pool_reaps_the_dirs_of_a_dead_process():
    require_bwrap()
    runtime_root = Path("/tmp") / f"rlpipe-test-pool-{uuid.uuid4().hex[:8]}"
    try:
        _reap_in(runtime_root)
    finally:
        shutil.rmtree(runtime_root, ignore_errors=True)


def _reap_in(tmp_path: Path) -> None:
    from rlpipe.sandbox.bwrap import BwrapSandbox, reap_leaked_sandboxes

    leaked = BwrapSandbox(Limits(), runtime_root=tmp_path)
    (leaked.dir / "owner").write_text("999999999 0\n")  # a pid that cannot exist
    leaked_dir, leaked._closed = leaked.dir, True  # "crash": never closed
    with SandboxPool(lambda: BwrapSandbox(Limits(), runtime_root=tmp_path), size=1,
                     reap_leaked=lambda: reap_leaked_sandboxes(tmp_path)) as pool:
        assert pool.reaped_at_start == 1 and not leaked_dir.exists()
    if leaked.cgroups is not None:
        assert not leaked.cgroups.memory_dir.exists() and not leaked.cgroups.pids_dir.exists()


@pytest.mark.parametrize(("backend", "reaper"), [
    ("bwrap", "rlpipe.sandbox.bwrap.reap_leaked_sandboxes"),
    ("docker", "rlpipe.sandbox.docker_backend.remove_leaked_containers"),
])
def test_the_train_runs_pool_reaps_with_its_backends_cleanup(monkeypatch, backend, reaper):
    """build_sandbox_pool hands SandboxPool the leak cleanup of the configured backend."""
    import importlib
    from types import SimpleNamespace

    import rlpipe.sandbox.pool
    from rlpipe.core.config import load_config
    from rlpipe.controller.launch import build_sandbox_pool

    made = {}
    monkeypatch.setattr(rlpipe.sandbox.pool, "SandboxPool", lambda factory, **kwargs: made.update(kwargs) or "pool")
    config = load_config(None, [f'sandbox.backend="{backend}"', "sandbox.pool_size=3"])
    code_only = SimpleNamespace(envs={"code": SimpleNamespace(needs_sandbox=True)})
    assert build_sandbox_pool(config, code_only) == "pool"
    module, _, name = reaper.rpartition(".")
    assert made["reap_leaked"] is getattr(importlib.import_module(module), name)
    assert made["size"] == 3 and made["memory_mb_per_sandbox"] == config.sandbox.memory_mb
    no_code = SimpleNamespace(envs={"arithmetic": SimpleNamespace(needs_sandbox=False)})
    assert build_sandbox_pool(config, no_code) is None
