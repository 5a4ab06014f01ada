"""The rollout engine as a Ray actor (workers/ray_engine.py) on the 2-node cluster (conftest.py)
against the local engine worker (client.py), both built from one tiny config:

- the same weights (digest) and, greedy and sampled with a seed, the same completions (tokens,
  logprobs, text, policy version) before and after a chunked weight sync from one trainer;
- an actor killed with ray.kill while it generates is an InfraError (EngineFailed), and the
  next call gets a fresh actor that `on_restart` synced to the trainer's weights;
- the train flow with cluster.engine_on_ray commits exactly steps x prompts x group rows.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from rlpipe.core.errors import ConfigError, EngineFailed, InfraError
from rlpipe.engines.sampling import SamplingParams
from rlpipe.workers.client import WorkerSpec
from rlpipe.workers.ray_engine import RayEngineClient
from rlpipe.workers.weight_stream import stream_weights
from tests.helpers.waiting import wait_until
from tests.workers.workers_at_hand import tiny_config, train_a_little, worker_pair

CHUNK = 16 * 1024  # the tiny model streams in several chunks, each through the object store
PROMPTS = [("a", "5+5="), ("b", "reverse abc="), ("c", "12+7=")]
GREEDY = SamplingParams(n=1, max_new_tokens=6, greedy=True)
SAMPLED = SamplingParams(n=3, max_new_tokens=6, temperature=1.0, seed=7)


def ray_engine(tmp_path: Path, address: str, run_id: str = "w", **resources: float) -> RayEngineClient:
    """The engine actor of the same tiny run worker_pair builds (same config, same run id)."""
    config = tiny_config(tmp_path)
    sockets = Path(tempfile.mkdtemp(prefix="rlr-"))
    return RayEngineClient(WorkerSpec(run_id, "engine", config.model_dump_json(), sockets, tmp_path / "shm"), address,
                           **resources)


def outputs(engine) -> tuple:  # noqa: ANN001 - an EngineClient
    return tuple(tuple(engine.generate(PROMPTS, params).completions) for params in (GREEDY, SAMPLED))


def test_the_actor_generates_what_the_local_worker_does_before_and_after_a_sync(ray_cluster, tmp_path) -> None:
    with worker_pair(tmp_path) as (local, trainer, shm):
        remote = ray_engine(tmp_path, ray_cluster)
        try:
            assert remote.digest() == local.digest()
            assert remote.handle.address.startswith("ray-actor:") and remote.info.node_id
            before = outputs(local)
            assert outputs(remote) == before
            assert len(before[1]) == len(PROMPTS) * SAMPLED.n

            train_a_little(trainer)
            trained = trainer.digest()
            for engine in (local, remote):
                streamed = stream_weights(trainer, engine, chunk_bytes=CHUNK)
                assert streamed.chunks > 1 and streamed.policy_version == 0
            assert remote.digest() == local.digest() == trained  # bit for bit, through the object store
            assert list(shm.iterdir()) == []  # every chunk file deleted on the controller's side too
            after = outputs(local)
            assert after != before  # the sync changed what the engine generates
            assert outputs(remote) == after
        finally:
            remote.close()


def test_a_killed_actor_is_an_infra_error_and_the_next_call_gets_a_fresh_synced_one(ray_cluster, tmp_path) -> None:
    import ray

    with worker_pair(tmp_path) as (local, trainer, _):
        remote = ray_engine(tmp_path, ray_cluster)
        try:
            remote.version()
            first = remote.handle
            train_a_little(trainer)
            remote.on_restart = lambda: stream_weights(trainer, remote, chunk_bytes=CHUNK)  # as controller/runtime.py does
            raised: list[BaseException] = []
            generating = _note_when_sent(remote, "Generate")

            def generate_a_lot() -> None:
                try:
                    remote.generate(PROMPTS * 50, SamplingParams(n=8, max_new_tokens=32, seed=1))
                except BaseException as exc:  # noqa: BLE001 - kept for the assert
                    raised.append(exc)

            worker = threading.Thread(target=generate_a_lot)
            worker.start()
            wait_until(generating.is_set, "the Generate request to be with the actor")
            ray.kill(remote._actor, no_restart=True)  # mid-call: 1200 completions of 32 tokens take far longer
            worker.join(timeout=120)
            assert len(raised) == 1 and isinstance(raised[0], EngineFailed), raised
            assert isinstance(raised[0], InfraError)

            assert remote.digest() == trainer.digest()  # a fresh actor, synced by on_restart
            assert remote.handle != first and remote.starts == 2
            stream_weights(trainer, local, chunk_bytes=CHUNK)
            assert outputs(remote) == outputs(local)
        finally:
            remote.close()


def _note_when_sent(remote: RayEngineClient, call: str) -> threading.Event:
    """An event set once a `call` request has been sent to the actor (the client then awaits
    its reply): an event to act on instead of a sleep that hopes the call is under way."""
    sent = threading.Event()
    get = remote._get

    def get_noting(ref, name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - RayEngineClient._get's
        if name == call:
            sent.set()
        return get(ref, name, *args, **kwargs)

    remote._get = get_noting
    return sent


def test_an_actor_no_node_can_hold_is_a_config_error(ray_cluster, tmp_path) -> None:
    remote = ray_engine(tmp_path, ray_cluster, num_gpus=1.0)  # the test nodes have no GPU
    try:
        with pytest.raises(ConfigError, match="no node of the Ray cluster"):
            remote.version()
    finally:
        remote.close()


def test_a_short_quickstart_run_with_the_engine_on_ray(ray_cluster, prefect_api_url, tmp_path) -> None:
    """configs/quickstart.toml shrunk to 2 steps x 4 prompts x 4 samples, the engine an actor
    (the flow runs against the session's Prefect harness, tests/conftest.py)."""
    from rlpipe.core.config import load_config
    from rlpipe.flows.train import train
    from rlpipe.storage.query import query_trajectories
    from rlpipe.controller.builders import build_lake
    from tests.helpers.mlflow_db import seed_mlflow_db

    seed_mlflow_db(tmp_path / "mlflow.db")
    config = load_config(Path("configs/quickstart.toml"), quickstart_shrunk(tmp_path, ray_cluster, steps=2))
    summary = train(config, "engine-on-ray")
    assert summary.steps_committed == 2
    counts = query_trajectories(build_lake(config), "select count(*), count(distinct (step, task_id, sample_idx)), "
                                                    "count(distinct step) from trajectories").rows
    assert counts == [(2 * 4 * 4, 2 * 4 * 4, 2)]  # steps x prompts x group, none twice


def quickstart_shrunk(tmp_path: Path, address: str, steps: int) -> list[str]:
    """Overrides that shrink the quickstart to seconds (benchmarks/engine_on_ray.py uses them too)."""
    shutil.rmtree(tmp_path / "lake", ignore_errors=True)
    return [f'storage.lake_uri="{tmp_path / "lake"}"', f'tracking.mlflow_uri="sqlite:///{tmp_path / "mlflow.db"}"',
            f"train.steps={steps}", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.dynamic_sampling=false",
            "warmstart.steps=2", "warmstart.batch_size=8", "envs.heldout_size=8", "train.micro_batch_size=16",
            "train.mini_batches_per_step=1",
            f'cluster.ray_address="{address}"', "cluster.engine_on_ray=true"]
