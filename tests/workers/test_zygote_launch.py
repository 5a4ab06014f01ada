"""Workers forked from the controller's zygote (workers/launch.py) keep what a spawned worker
had: each in its own session (a terminal ^C reaches only the controller), the zygote single-
threaded when it forks and never CUDA-initialised, a restart forked from the same zygote, and
the controller's environment of the launch (a crash point armed after the zygote started
reaches the next fresh worker; an environment the zygote was not started with gets a fresh
zygote). RLPIPE_WORKER_LAUNCH=spawn starts the worker as this process's child. A controller
killed with SIGKILL leaves neither worker nor zygote: test_no_orphans.py. These tests keep
off the session's shared zygote (test_shared_zygote.py tests that one)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from rlpipe.core.errors import EngineFailed
from rlpipe.engines.sampling import SamplingParams
from rlpipe.workers import launch
from tests.workers.workers_at_hand import engine_worker, wait_until_gone, worker_pair

PARAMS = SamplingParams(n=1, max_new_tokens=2, seed=3)
PROMPTS = [("t", "1+1=")]


@pytest.fixture(autouse=True)
def _own_zygote(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(launch.SHARED_ZYGOTE_ENV_VAR, raising=False)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_workers_fork_from_one_zygote_each_in_its_own_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(launch.LAUNCH_ENV_VAR, raising=False)
    with worker_pair(tmp_path) as (engine, trainer, _):
        engine.version(), trainer.digest()
        zygote = launch.zygote_pid()
        assert zygote is not None
        assert os.listdir(f"/proc/{zygote}/task") == [str(zygote)]  # one thread: safe to fork
        assert b"libcuda" not in Path(f"/proc/{zygote}/maps").read_bytes()  # CUDA never initialised
        assert os.getsid(zygote) == zygote != os.getsid(0)
        for pid in (engine.pid, trainer.pid):
            assert _parent(pid) == zygote
            assert os.getsid(pid) == os.getpgid(pid) == pid  # its own session and group
        old = engine.pid
        os.kill(old, signal.SIGKILL)
        assert wait_until_gone([old]) == []
        engine.version()  # the restart is forked by the same zygote
        assert engine.pid != old and _parent(engine.pid) == zygote and engine.starts == 2


def test_a_fresh_worker_gets_the_controllers_environment_of_its_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(launch.LAUNCH_ENV_VAR, raising=False)
    monkeypatch.delenv("RLPIPE_FAILPOINTS", raising=False)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    with engine_worker(tmp_path / "a", run_id="a") as first:
        first.generate(PROMPTS, PARAMS)
        zygote = launch.zygote_pid()
        # Armed after the zygote started: only the launch's environment can carry it.
        monkeypatch.setenv("RLPIPE_FAILPOINTS", "engine-generate@1")
        with engine_worker(tmp_path / "b", run_id="b") as second:
            with pytest.raises(EngineFailed, match="died during Generate"):
                second.generate(PROMPTS, PARAMS)
            assert launch.zygote_pid() == zygote  # a crash point needs no fresh zygote
            assert len(second.generate(PROMPTS, PARAMS).completions) == 1  # restarted without it
        first.generate(PROMPTS, PARAMS)  # armed after its start: never reaches the running worker
        monkeypatch.setenv("RLPIPE_ZYGOTE_TEST_MARK", "changed")  # a variable torch might read at import
        os.kill(first.pid, signal.SIGKILL)
        first.generate(PROMPTS, PARAMS)
        assert launch.zygote_pid() not in (None, zygote) and _parent(first.pid) == launch.zygote_pid()


def test_the_spawn_escape_hatch_starts_the_worker_as_a_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(launch.LAUNCH_ENV_VAR, "spawn")
    with engine_worker(tmp_path) as engine:
        engine.version()
        assert _parent(engine.pid) == os.getpid() and os.getsid(engine.pid) == engine.pid
    monkeypatch.setenv(launch.LAUNCH_ENV_VAR, "fork")
    with pytest.raises(Exception, match="not a launch mode"):
        launch.uses_zygote("/usr/bin/python3")
