"""Workers forked from a shared zygote (workers/launch.py, RLPIPE_ZYGOTE_SOCKET): one zygote,
started once, serves every controller that connects, and a worker forked there keeps what
a worker of the controller's own zygote had: its own session, the controller's environment
and umask of its launch (a crash point armed after the zygote started reaches the next fresh worker
and not the restart after it), restarts forked from the same zygote, and an end when its
controller is killed with SIGKILL (the zygote itself serves on). A launch whose import
settings differ from the zygote's (another thread count), or that names a socket where no
zygote listens, forks from the controller's own zygote instead. The variables that
`import_settings` leaves out are not read by the zygote's imports."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlpipe.core.errors import EngineFailed
from rlpipe.engines.sampling import SamplingParams
from rlpipe.workers import launch
from rlpipe.workers.zygote import import_settings
from tests.durability.cli_runs import REPO_ROOT
from tests.helpers.import_reads import read_at_import
from tests.workers.workers_at_hand import alive, engine_worker, wait_until_gone, worker_pair

PARAMS = SamplingParams(n=1, max_new_tokens=2, seed=3)
PROMPTS = [("t", "1+1=")]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _umask(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))


@pytest.fixture(scope="module")
def shared_socket() -> Iterator[str]:
    """A shared zygote of this module's own, started with the environment as it is now: the
    session's (tests/conftest.py) started before earlier tests of this process may have
    changed a variable it compares, and would then be refused (the fallback, tested below)."""
    folder = tempfile.mkdtemp(prefix="rlz-")
    path = os.path.join(folder, "zygote.sock")
    zygote = launch.start_shared_zygote(path)
    try:
        yield path
    finally:
        zygote.terminate()
        zygote.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


def test_controllers_fork_their_workers_from_the_shared_zygote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                shared_socket: str) -> None:
    monkeypatch.setenv(launch.SHARED_ZYGOTE_ENV_VAR, shared_socket)
    monkeypatch.delenv("RLPIPE_FAILPOINTS", raising=False)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    with engine_worker(tmp_path / "a", run_id="a") as first:
        first.generate(PROMPTS, PARAMS)
        shared = launch.shared_zygote_pid()
        assert shared is not None and launch.zygote_pid() is None  # no zygote of this controller's own
        assert _parent(first.pid) == shared and os.getsid(first.pid) == os.getpgid(first.pid) == first.pid
        assert os.listdir(f"/proc/{shared}/task") == [str(shared)]  # one thread: safe to fork
        # Armed after the shared zygote started: only the launch's environment can carry it.
        monkeypatch.setenv("RLPIPE_FAILPOINTS", "engine-generate@1")
        umask = os.umask(0o027)  # the controller's of the launch, not the zygote's
        try:
            with engine_worker(tmp_path / "b", run_id="b") as second:
                with pytest.raises(EngineFailed, match="died during Generate"):
                    second.generate(PROMPTS, PARAMS)
                assert len(second.generate(PROMPTS, PARAMS).completions) == 1  # restarted without it
                assert _parent(second.pid) == shared and second.starts == 2
                assert _umask(second.pid) == 0o027 != _umask(shared)
        finally:
            os.umask(umask)
        old = first.pid
        os.kill(old, signal.SIGKILL)
        assert wait_until_gone([old]) == []
        first.generate(PROMPTS, PARAMS)  # the restart: forked by the same zygote
        assert first.pid != old and _parent(first.pid) == shared and first.starts == 2
    assert alive(shared)  # it serves on after its controllers' workers stopped


CONTROLLER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from rlpipe.workers.launch import shared_zygote_pid, zygote_pid
    from tests.workers.workers_at_hand import worker_pair
    with worker_pair(Path(sys.argv[1])) as (engine, trainer, shm):
        engine.version(), trainer.digest()  # both ready
        print(json.dumps({"pids": [engine.pid, trainer.pid], "shared": shared_zygote_pid(), "own": zygote_pid(),
                          "sockets": str(engine.spec.socket_folder), "shm": str(shm)}), flush=True)
        time.sleep(600)
""")


def test_a_controller_killed_with_sigkill_leaves_no_worker_and_the_shared_zygote_serves_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_socket: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), launch.SHARED_ZYGOTE_ENV_VAR: shared_socket}
    (tmp_path / "killed").mkdir(), (tmp_path / "next").mkdir()
    controller = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(tmp_path / "killed")], stdout=subprocess.PIPE,
                                  text=True, env=env, cwd=REPO_ROOT)
    try:
        started = json.loads(controller.stdout.readline())
        assert started["own"] is None and all(_parent(pid) == started["shared"] for pid in started["pids"])
        controller.kill()  # SIGKILL: no finally, no atexit
        controller.wait()
        assert wait_until_gone(started["pids"], timeout_s=60) == []
        assert not Path(started["sockets"]).exists() and not Path(started["shm"]).exists()
    finally:
        if controller.poll() is None:
            controller.kill()
    assert alive(started["shared"])
    monkeypatch.setenv(launch.SHARED_ZYGOTE_ENV_VAR, shared_socket)
    with worker_pair(tmp_path / "next", start_trainer=False) as (engine, _, _):
        engine.version()
        assert _parent(engine.pid) == started["shared"]


def test_a_launch_the_shared_zygote_does_not_fit_forks_from_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    shared_socket: str) -> None:
    (tmp_path / "stale").mkdir(), (tmp_path / "threads").mkdir()
    monkeypatch.setenv(launch.SHARED_ZYGOTE_ENV_VAR, str(tmp_path / "no-zygote-listens-here.sock"))
    with engine_worker(tmp_path / "stale") as engine:
        engine.version()
        assert launch.shared_zygote_pid() is None and _parent(engine.pid) == launch.zygote_pid() is not None
    monkeypatch.setenv(launch.SHARED_ZYGOTE_ENV_VAR, shared_socket)
    monkeypatch.setenv("OMP_NUM_THREADS", str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 1))  # libgomp reads it at import
    with engine_worker(tmp_path / "threads") as engine:
        engine.version()
        shared, own = launch.shared_zygote_pid(), launch.zygote_pid()
        assert shared is not None and own is not None and _parent(engine.pid) == own != shared


# Run-scoped variables that the imports read by name and that change nothing a worker does:
# rlpipe/__init__.py sets telemetry defaults (a fork gets its controller's environment anyway),
# and accelerate's `accelerate config` menu reads the terminal size.
READ_AND_HARMLESS = {"PREFECT_SERVER_ANALYTICS_ENABLED", "MLFLOW_DISABLE_TELEMETRY", "COLUMNS", "LINES"}


def test_the_variables_a_shared_zygote_ignores_are_not_read_by_its_imports() -> None:
    read_by_name, modules = read_at_import("rlpipe.workers.zygote")
    assert "polars" not in modules  # its allocator reads _RJEM_MALLOC_CONF as it loads, in C
    assert {"HF_HOME", "HF_HUB_OFFLINE"} <= read_by_name  # it sees reads that matter (huggingface_hub)
    assert {key for key in read_by_name if not import_settings({key: ""})} <= READ_AND_HARMLESS
