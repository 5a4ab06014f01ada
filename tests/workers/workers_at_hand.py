"""Helpers for worker tests: a pair of real workers (engine, trainer) for a tiny config, or
the engine worker alone (each worker start imports torch and transformers: a test that never
calls the trainer does not start one), started in this process and stopped at the end, and
process checks through /proc, and a little training to change the trainer's weights."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlpipe.core.config import RunConfig, load_config
from rlpipe.workers.client import EngineClient, TrainerClient, WorkerSpec
from rlpipe.workers.protocol import WarmStartBegin
from tests.helpers.waiting import wait_until

TINY = ["warmstart.steps=3", "warmstart.batch_size=8", "envs.heldout_size=4", "rollout.group_size=2"]


def tiny_config(tmp_path: Path, *overrides: str) -> RunConfig:
    where = [f'storage.lake_uri="{tmp_path / "lake"}"', f'tracking.mlflow_uri="sqlite:///{tmp_path / "mlflow.db"}"']
    return load_config(None, TINY + where + list(overrides))


@contextmanager
def engine_worker(tmp_path: Path, run_id: str = "w") -> Iterator[EngineClient]:
    """The engine worker of a tiny run, without a trainer."""
    with worker_pair(tmp_path, run_id, start_trainer=False) as (engine, _, _):
        yield engine


@contextmanager
def worker_pair(
    tmp_path: Path, run_id: str = "w", *overrides: str, start_trainer: bool = True
) -> Iterator[tuple[EngineClient, TrainerClient, Path]]:
    """(engine, trainer, weights folder) of a tiny run; the socket folder is short (AF_UNIX
    paths stop at 107 bytes). With start_trainer=False the trainer starts on its first call."""
    config = tiny_config(tmp_path, *overrides)
    sockets = Path(tempfile.mkdtemp(prefix="rlw-"))
    shm = tmp_path / "shm"
    shm.mkdir()

    def spec(kind: str) -> WorkerSpec:
        return WorkerSpec(run_id, kind, config.model_dump_json(), sockets, shm)

    engine, trainer = EngineClient(spec("engine")), TrainerClient(spec("trainer"))
    try:
        engine.start()
        if start_trainer:
            trainer.start()
        yield engine, trainer, shm
    finally:
        engine.stop()
        trainer.stop()
        shutil.rmtree(sockets, ignore_errors=True)


def train_a_little(trainer: TrainerClient) -> None:
    """3 supervised steps on two examples: the trainer's weights change. Waits for the
    warm-start's end in 1 s polls, failing the test (never looping on) if it has not ended
    by the hang guard (a worker that died raises from the poll instead)."""
    trainer.warm_start_begin(WarmStartBegin(examples=(("1+2=", "3"), ("2+2=", "4")), steps=3, batch_size=4,
                                            lr=1e-2, seed=1, check_every=5, with_checks=False))
    wait_until(lambda: trainer.warm_start_wait(1.0).state == "done", "the trainer's 3 warm-start steps", every_s=0)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def wait_until_gone(pids: list[int], timeout_s: float = 60.0) -> list[int]:
    """Poll until none of `pids` runs; returns those still running at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
