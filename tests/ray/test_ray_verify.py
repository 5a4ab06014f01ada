"""The code domain verified on a 2-node Ray cluster (conftest.py) gives the local pool's verdicts.

Both pools are built by controller/runtime.py's `build_sandbox_pool` from one config (bwrap
sandboxes), the only difference being `cluster.ray_address`; verify_batch runs the same
pairs on each. Verdicts are compared whole, `duration_s` aside (wall time): reward, passed,
reason, detail, verifier version, in input order. The pairs hold right and wrong answers,
reward-hack probes (rlpipe/envs/code_probes.py, which must score 0 on both) and a loop that
ends by the timeout. A verifier actor killed with SIGKILL mid-batch, or the whole cluster
stopped mid-batch, gives ClusterUnavailable (an InfraError: the stage is retried), never a
verdict; the next batch runs on fresh actors (or, the cluster gone, fails fast again). And
the train flow with cluster.ray_address set runs a tiny code run to the end.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading

import pytest

from rlpipe.controller.launch import build_sandbox_pool
from rlpipe.controller.sample import build_mixture
from rlpipe.controller.verify_batch import verify_batch
from rlpipe.core.config import load_config
from rlpipe.core.errors import ClusterUnavailable, InfraError, SandboxUnavailable
from rlpipe.core.records import VerdictReason
from rlpipe.envs.code_probes import PROBES
from rlpipe.sandbox.ray_pool import RaySandboxPool
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.bwrap
HACKS = ["os_exit_zero_before_the_tests", "print_pass_lines_and_nonce_guesses", "always_equal_object",
         "read_the_harness_frames", "patch_builtins"]
CODE = ["envs.domains={code = 1.0}", "sandbox.backend=\"bwrap\"", "sandbox.pool_size=1", "sandbox.timeout_s=3.0",
        "sandbox.memory_mb=256"]


@pytest.fixture(scope="module")
def mixture():
    return build_mixture(load_config(None, CODE))


@pytest.fixture(scope="module")
def pairs(mixture):
    env = mixture.envs["code"]
    tasks = env.all_tasks()[:6]
    probes = {probe.name: probe for probe in PROBES}
    right = [(task, task.reference_answer) for task in tasks]
    wrong = [(task, "    return None\n") for task in tasks[:2]]
    hacks = [(env.task(probes[name].task_id), probes[name].completion) for name in HACKS]
    endless = [(tasks[0], "    while True:\n        pass\n")]
    return right[:3] + hacks[:2] + endless + wrong + hacks[2:] + right[3:]  # mixed, so order matters


def comparable(verdicts):
    return [dataclasses.replace(verdict, duration_s=0.0) for verdict in verdicts]


def build(address: str | None):
    config = load_config(None, CODE + ([f'cluster.ray_address="{address}"', "cluster.ray_workers=2"] if address else []))
    try:
        return build_sandbox_pool(config, build_mixture(config))
    except SandboxUnavailable as exc:
        pytest.skip(f"bwrap sandboxes cannot start here: {exc.message}")


def test_code_verdicts_on_ray_equal_the_local_pool(ray_cluster, mixture, pairs):
    local = build(None)
    try:
        expected = verify_batch(mixture, local, pairs)
    finally:
        local.close()
    ray_pool = build(ray_cluster)
    try:
        assert isinstance(ray_pool, RaySandboxPool)
        assert len({info.node_id for info in ray_pool.infos}) == 2  # SPREAD: one actor on each node
        got = verify_batch(mixture, ray_pool, pairs)
    finally:
        ray_pool.close()
    assert comparable(got) == comparable(expected)
    reasons = [verdict.reason for verdict in got]
    # 6 right answers, 2 wrong, 5 hacks that must fail, 1 loop: the timeout
    assert reasons.count(VerdictReason.OK) == 6
    assert reasons[5] is VerdictReason.TIMEOUT
    assert all(verdict.reward == 0.0 for verdict in got[3:5] + got[8:11])


def test_a_killed_actor_mid_batch_is_an_infra_error_and_the_next_batch_runs(ray_cluster, mixture, pairs):
    ray_pool = build(ray_cluster)
    try:
        victim = ray_pool.infos[0].pid
        dispatched = _note_dispatch(ray_pool)
        worker, raised = _verify_in_background(mixture, ray_pool, _slow_pairs(mixture))
        wait_until(dispatched.is_set, "the batch's shares to be with the actors")
        os.kill(victim, signal.SIGKILL)
        worker.join(timeout=120)
        assert len(raised) == 1 and isinstance(raised[0], ClusterUnavailable), raised
        assert isinstance(raised[0], InfraError)
        assert ray_pool.infos == []  # the actors were dropped
        again = verify_batch(mixture, ray_pool, pairs[:3])  # fresh actors
        assert [verdict.reason for verdict in again] == [VerdictReason.OK] * 3
        assert victim not in {info.pid for info in ray_pool.infos}
    finally:
        ray_pool.close()


def test_an_unreachable_cluster_is_an_infra_error(ray_cluster):
    import socket

    with socket.socket() as probe:  # a port nobody listens on: bound, never listening
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
        with pytest.raises(ClusterUnavailable) as raised:
            RaySandboxPool(address, lambda: None, workers=1)
    assert "unreachable" in raised.value.message


def test_tiny_code_run_verifies_on_the_ray_cluster(ray_cluster, tmp_path):
    """The train flow with cluster.ray_address set: every row verified by the cluster's actors."""
    from rlpipe.flows.train import train
    from rlpipe.storage.query import query_trajectories
    from rlpipe.controller.builders import build_lake
    from tests.flows.runs import tiny_config

    config = tiny_config(tmp_path, "envs.domains={code = 1.0}", 'sandbox.backend="bwrap"', "sandbox.timeout_s=5.0",
                         "sandbox.pool_size=1", f'cluster.ray_address="{ray_cluster}"', "cluster.ray_workers=2",
                         "train.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=6",
                         "warmstart.steps=1", "warmstart.batch_size=2", "envs.heldout_size=2",
                         "model.max_position_embeddings=2048")
    summary = train(config, "code-on-ray")
    lake = build_lake(config)
    assert summary.steps_committed == 2
    rows = query_trajectories(lake, "select reason, reward from trajectories").rows
    assert len(rows) == 2 * 2 * 2  # steps x prompts x samples
    assert all(reason != VerdictReason.SANDBOX_ERROR.value and reward in (0.0, 1.0) for reason, reward in rows)


def test_a_cluster_stopped_mid_batch_is_an_infra_error(mixture):
    """A cluster of its own (the session's one must live on), stopped while a batch runs."""
    from tests.helpers.ray_cluster import local_ray_cluster

    slow = _slow_pairs(mixture)
    with local_ray_cluster((2,)) as cluster:
        ray_pool = build(cluster.address)
        dispatched = _note_dispatch(ray_pool)
        worker, raised = _verify_in_background(mixture, ray_pool, slow)
        try:
            wait_until(dispatched.is_set, "the batch's shares to be with the actors")
            cluster.stop()
            worker.join(timeout=120)
            assert len(raised) == 1 and isinstance(raised[0], ClusterUnavailable), raised
            with pytest.raises(ClusterUnavailable, match="unreachable"):  # the stage's retry: fails fast, no hang
                verify_batch(mixture, ray_pool, slow[:1])
        finally:
            ray_pool.close()


def _slow_pairs(mixture) -> list:
    """12 answers that each sleep 2 s (under the 3 s sandbox timeout): a batch of >= 12 s on 2
    sandboxes, so a kill right after the shares are dispatched lands mid-batch."""
    task = mixture.envs["code"].all_tasks()[0]
    return [(task, "    import time\n    time.sleep(2.0)\n" + task.reference_answer)] * 12


class _RayNotingWait:
    """The ray module as RaySandboxPool uses it, with `dispatched` set at the pool's first
    `ray.wait`: every share in flight has been submitted to the actors by then."""

    def __init__(self, ray) -> None:  # noqa: ANN001 - the ray module
        self._ray = ray
        self.dispatched = threading.Event()

    def __getattr__(self, name: str):  # noqa: ANN204 - whatever ray has
        return getattr(self._ray, name)

    def wait(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - ray.wait's
        self.dispatched.set()
        return self._ray.wait(*args, **kwargs)


def _note_dispatch(ray_pool: RaySandboxPool) -> threading.Event:
    """An event set once the pool's next batch is with the actors: to act on instead of a
    sleep that hopes the batch is under way."""
    noting = _RayNotingWait(ray_pool.ray)
    ray_pool.ray = noting
    return noting.dispatched


def _verify_in_background(mixture, ray_pool, pairs) -> tuple[threading.Thread, list[BaseException]]:
    """verify_batch in a thread (started); what it raised lands in the returned list."""
    raised: list[BaseException] = []

    def verify() -> None:
        try:
            verify_batch(mixture, ray_pool, pairs)
        except BaseException as exc:  # noqa: BLE001 - kept for the test's assert
            raised.append(exc)

    worker = threading.Thread(target=verify)
    worker.start()
    return worker, raised
