"""The trainer's update under torchrun (cluster.trainer_nproc = 2, gloo on loopback): the two
ranks' update is the one-process update, and a rank that dies is a TrainerGroupFailed (an
InfraError), never a hang, with no process left behind.

Tolerance of the equality: the ranks add the same micro-batch gradients in another order
(rank 0's micro-batches 0, 2, 4, 6 and rank 1's 1, 3, 5, then the two partial sums) than one
process (0, 1, ..., 6), so float32 rounding differs: about 1e-7 relative for most gradient
components, but far more for a component whose terms nearly cancel, and AdamW divides each
component by its own scale (a first step is about lr x sign(g)), so such a component's step
changes by up to lr x its relative error. Measured on this machine (lr 1e-2, two optimizer
steps per update, weights moved 0.02 per update): max weight difference 8.7e-7 and 1.9e-6
after one and two updates with token_mean, 1.6e-6 and 9.6e-6 with seq_mean_token_sum. ATOL =
1e-4 (1% of one step) after two updates; one micro-batch of 3 rows left out of the same update
moves weights by 0.04, 400x more. A rank stepping its own partial gradient, or a micro-batch
counted twice, is of that size too. AdamW's step does not see a uniform scale of the
gradient (DDP's averaging: every gradient halved), so the metrics are compared as well:
`train/grad_norm` is the pre-clip norm of the summed gradient and `train/loss` the summed
loss, each within rel 1e-5 (measured: 2.5e-7).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from rlpipe.core.config import load_config
from rlpipe.core.errors import TrainerGroupFailed
from rlpipe.storage.lake import Lake
from rlpipe.workers import protocol as p
from rlpipe.workers.client import TrainerClient, WorkerSpec
from rlpipe.workers.trainer_group import TrainerGroupService
from rlpipe.workers.trainer_worker import TrainerService
from tests.durability.cli_runs import REPO_ROOT
from tests.helpers.processes import is_zygote, processes_marked, shared_zygote_workers
from tests.helpers.trajectories import make_trajectory
from tests.workers.workers_at_hand import wait_until_gone

ATOL = 1e-4  # see the module docstring
TINY_MODEL = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
              "model.device=\"cpu\""]
# 7 micro-batches of 3 per mini-batch of ~20 trained rows: rank 0 computes 4, rank 1 computes 3.
TRAIN = ["train.micro_batch_size=3", "train.mini_batches_per_step=2", "train.lr=1e-2", "algo.kl_coef=0.05"]


def rows_of_step(step: int, count: int = 40):
    """Rows of varied lengths and advantages (None, 0.0 and both signs), like a real step's."""
    rows = []
    for index in range(count):
        row = make_trajectory("g", step, index)
        tokens = tuple(40 + (index * 7 + k) % 20 for k in range(1 + index % 5))
        logprobs = tuple(-0.25 * (1 + (index + k) % 6) for k in range(len(tokens)))
        completion = dataclasses.replace(row.completion, token_ids=tokens, logprobs=logprobs)
        rows.append(dataclasses.replace(row, completion=completion, advantage=None if index % 9 == 8 else
                                        0.0 if index % 7 == 3 else (-1.0) ** index * (0.5 + index % 4)))
    return rows


def write_steps(lake_uri: str, steps: int) -> list[tuple]:
    lake = Lake.open(lake_uri)
    return [(lake.write_part("g", step, "00000", rows_of_step(step)),) for step in range(1, steps + 1)]


def group_config(tmp_path: Path, *overrides: str):
    return load_config(None, [*TINY_MODEL, *TRAIN, f'storage.lake_uri="{tmp_path / "lake"}"', "cluster.trainer_nproc=2",
                              *overrides])


def boot_of(config, sockets: Path) -> dict:
    return dict(run_id="g", kind="trainer", socket_folder=str(sockets), config_json=config.model_dump_json(), secrets={})


def rank_digests(group: TrainerGroupService) -> list[str]:
    """Every rank's weight digest (the relay sends WeightsDigest to rank 0 only)."""
    return [group._call([rank], p.RankCall(p.WeightsDigest())) for rank in range(group.nproc)]


# Both normalise by the whole mini-batch; the second is `extended` (not CI, for its time): the
# group's sum is the same code for both, and the one-process update of each is tested apart.
@pytest.mark.parametrize("aggregation", ["token_mean", pytest.param("seq_mean_token_sum", marks=pytest.mark.extended)])
def test_two_ranks_update_the_weights_as_one_process_does(tmp_path: Path, aggregation: str) -> None:
    config = group_config(tmp_path, f'algo.loss_agg="{aggregation}"')
    parts = write_steps(config.storage.lake_uri, 2)
    single = TrainerService("g", config)
    initial = {name: tensor.clone() for name, tensor in single.trainer.named_weights()}
    sockets = Path(tempfile.mkdtemp(prefix="rlg-"))
    group = TrainerGroupService(boot_of(config, sockets), config)
    try:
        for step, part in enumerate(parts, start=1):
            expected = single.update(step, part, shuffle_seed=step)
            got = group.handle(p.Update(step, part, shuffle_seed=step))
            assert got.policy_version == step
            assert got.metrics.keys() == expected.metrics.keys()
            for name, value in expected.metrics.items():  # sums in another order: same tolerance
                assert got.metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
        digests = rank_digests(group)
        assert digests[0] == digests[1]  # every rank stepped the same summed gradient
        path = group.handle(p.PublishWeights(str(tmp_path))).path
    finally:
        group.close()
        shutil.rmtree(sockets, ignore_errors=True)
    from safetensors.torch import load_file

    grouped = load_file(path)
    differences = {name: float((grouped[name] - tensor).abs().max()) for name, tensor in single.trainer.named_weights()}
    moved = max(float((tensor - initial[name]).abs().max()) for name, tensor in single.trainer.named_weights())
    assert max(differences.values()) <= ATOL, (max(differences.values()), moved)
    assert moved > 100 * ATOL  # the update moved the weights far more than the tolerance


def test_a_rank_killed_mid_update_is_an_infra_error_and_leaves_no_process(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 SIGKILLs itself just before its first all-reduce, while rank 0 waits in it: the
    update raises TrainerGroupFailed in the controller (an InfraError: the stage is retried),
    the worker, torchrun and rank 0 exit, and the next calls start a fresh worker and group
    that restores the checkpoint and updates as one process does."""
    config = group_config(tmp_path, "cluster.trainer_timeout_s=120")
    parts = write_steps(config.storage.lake_uri, 1)
    monkeypatch.setenv("RLPIPE_FAILPOINTS", "all-reduce-rank-1@1")
    mark = ("RLPIPE_TEST_TORCHRUN_GROUP", str(tmp_path))
    monkeypatch.setenv(*mark)  # inherited by the worker, torchrun and the ranks
    workers_before = shared_zygote_workers()  # a worker forked there carries no marker: counted apart

    def started(zygotes: bool) -> list[int]:
        """This test's processes; with `zygotes`, a controller's own zygote too (it lives until close())."""
        marked = [pid for pid in processes_marked(*mark, shared_zygote_counted=True)
                  if pid != os.getpid() and (zygotes or not is_zygote(pid))]
        return marked + sorted(shared_zygote_workers() - workers_before - set(marked))

    sockets = Path(tempfile.mkdtemp(prefix="rlg-"))
    trainer = TrainerClient(WorkerSpec("g", "trainer", config.model_dump_json(), sockets, tmp_path))
    try:
        trainer.start()
        trainer.digest()  # ready: the group started
        worker = trainer.pid
        group = started(zygotes=False)
        assert worker in group and len(group) >= 4  # the worker, torchrun, two ranks
        trainer.save_checkpoint(0, config.config_hash())  # rank 0 writes it; the fresh group restores it
        with pytest.raises(TrainerGroupFailed, match="trainer group"):
            trainer.update(1, parts[0], shuffle_seed=1)
        assert wait_until_gone([worker, *group]) == []
        monkeypatch.delenv("RLPIPE_FAILPOINTS")
        # What the retried stage does: a fresh worker and group, restored from the lake, then the update.
        restored = trainer.restore(None, config.seed)  # every rank loads checkpoint 0
        assert (restored.checkpoint_step, restored.policy_version) == (0, 0) and trainer.pid != worker
        result = trainer.update(1, parts[0], shuffle_seed=1)
        expected = TrainerService("g", config).update(1, parts[0], shuffle_seed=1)
        assert result.policy_version == 1
        assert result.metrics["train/grad_norm"] == pytest.approx(expected.metrics["train/grad_norm"], rel=1e-5)
        survivors = started(zygotes=True)
    finally:
        trainer.close()  # the worker, its group (and its own zygote, if it had one)
        shutil.rmtree(sockets, ignore_errors=True)
    assert wait_until_gone(survivors) == []


CONTROLLER = textwrap.dedent("""
    import sys, tempfile, time
    from pathlib import Path
    from rlpipe.workers.client import TrainerClient, WorkerSpec
    from tests.workers.test_trainer_group import group_config
    config = group_config(Path(sys.argv[1]))
    trainer = TrainerClient(WorkerSpec("g", "trainer", config.model_dump_json(), Path(tempfile.mkdtemp(prefix="rlg-")),
                                       Path(sys.argv[1])))
    trainer.start()
    trainer.digest()  # ready: the group started
    print(trainer.pid, flush=True)
    time.sleep(600)
""")


def test_a_controller_killed_with_sigkill_leaves_no_rank_behind(tmp_path: Path) -> None:
    """The trainer worker's watchdog ends it, each rank's watchdog (or closed socket) ends the
    ranks, and torchrun ends with its ranks: nothing of the run is left. The worker may fork
    from the session's shared zygote, where no marker finds it: it is counted among that
    zygote's new workers (tests/helpers/processes.py)."""
    mark = ("RLPIPE_TEST_TORCHRUN_GROUP", str(tmp_path))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), mark[0]: mark[1]}
    workers_before = shared_zygote_workers()
    controller = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                                  env=env, cwd=REPO_ROOT)
    try:
        worker = int(controller.stdout.readline())
        started = [pid for pid in processes_marked(*mark, shared_zygote_counted=True) if pid != os.getpid()]
        started += sorted(shared_zygote_workers() - workers_before - set(started))
        assert worker in started and len(started) >= 5  # controller, worker, torchrun, two ranks
        controller.kill()  # SIGKILL: no finally, no atexit
        controller.wait()
        assert wait_until_gone(started, timeout_s=60) == []
    finally:
        if controller.poll() is None:
            controller.kill()
