"""The RPC between the controller and a worker: requests and replies round-trip, and an
error raised in a worker is raised again in the controller as its own class (rlpipe
errors), EngineFailed (machinery faults: retried) or RemoteError (bugs: not retried)."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

from rlpipe.core.errors import EngineFailed, ModelNotFoundError, StorageUnavailable
from rlpipe.engines.sampling import SamplingParams
from rlpipe.workers.client import EngineClient, WorkerSpec
from rlpipe.workers.protocol import RemoteError, UpdateResult, failed_from, raise_failed
from tests.workers.workers_at_hand import engine_worker, tiny_config


def _carried(error: BaseException) -> BaseException:
    """What the controller raises for `error` raised in a worker."""
    try:
        raise error
    except BaseException as exc:  # noqa: BLE001
        failed = failed_from(exc, traceback.format_exc())
    with pytest.raises(BaseException) as caught:
        raise_failed(failed, "trainer", "Update")
    return caught.value


def test_errors_cross_as_their_own_class_infra_faults_as_engine_failed_bugs_as_remote_error() -> None:
    storage = _carried(StorageUnavailable("s3 down (test)", hint="wait"))
    assert type(storage) is StorageUnavailable and storage.message == "s3 down (test)" and storage.hint == "wait"
    device = _carried(RuntimeError("CUDA error: illegal memory access (test)"))
    assert isinstance(device, EngineFailed) and "CUDA error" in device.message
    bug = _carried(ValueError("bad shape (test)"))
    assert isinstance(bug, RemoteError) and "ValueError" in str(bug) and "bad shape (test)" in str(bug)
    assert "Traceback" in str(bug)  # the worker's traceback travels with it


def test_generate_and_version_round_trip_through_a_real_engine_worker(tmp_path: Path) -> None:
    with engine_worker(tmp_path) as engine:
        params = SamplingParams(n=3, max_new_tokens=4, seed=5)
        result = engine.generate([("t1", "1+2="), ("t2", "3+4=")], params)
        # 2 prompts x n=3, prompt-major, each stamped with the version the engine serves (0)
        assert [(c.task_id, c.sample_idx) for c in result.completions] == [
            ("t1", 0), ("t1", 1), ("t1", 2), ("t2", 0), ("t2", 1), ("t2", 2)]
        assert result.policy_version == 0 and {c.policy_version for c in result.completions} == {0}
        assert all(len(c.token_ids) == len(c.logprobs) >= 1 for c in result.completions)
        assert engine.version() == 0
        again = engine.generate([("t1", "1+2="), ("t2", "3+4=")], params)
        assert again.completions == result.completions  # same seed, same weights: same samples
        assert engine.handle.kind == "engine" and engine.handle.pid == engine.pid


def test_a_request_the_worker_does_not_serve_is_a_remote_error_and_the_worker_lives_on(tmp_path: Path) -> None:
    with engine_worker(tmp_path) as engine:
        engine.version()
        pid_before = engine.pid
        with pytest.raises(RemoteError, match="does not serve UpdateResult"):
            engine.call(UpdateResult(1))
        assert engine.version() == 0 and engine.pid == pid_before


def test_a_worker_that_cannot_build_its_model_reports_the_error_at_the_first_call(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, f'model.path="{tmp_path / "no-such-model"}"')
    sockets = tmp_path / "s"
    sockets.mkdir()
    engine = EngineClient(WorkerSpec("bad", "engine", config.model_dump_json(), sockets, tmp_path / "shm"))
    try:
        with pytest.raises(ModelNotFoundError, match="model folder not found") as caught:
            engine.version()
        assert caught.value.hint  # the worker's hint reached the controller
        assert engine.pid is None  # nothing left running
    finally:
        engine.stop()
