"""One rank of the trainer's torchrun group (cluster.trainer_nproc > 1): the entry point that
workers/trainer_group.py starts as

    python -m torch.distributed.run --standalone --nproc-per-node N -m rlpipe.workers.trainer_rank

Each rank connects back to the trainer worker that started the group (AF_UNIX, the authkey
from the 0600 file named by RLPIPE_TRAINER_GROUP; never argv), says its rank and pid, reads the
worker's bootstrap (the run config and its secrets), joins the process group (gloo on CPU,
NCCL on CUDA with GPU LOCAL_RANK; the group's timeout is cluster.trainer_timeout_s), builds
a TrainerService with its RankShare and answers Ready (or Failed). Then it answers RankCalls
one at a time until Stop or the worker's connection closes: Update and Restore reach every
rank (they run collectives), everything else rank 0 only.

Death: a watchdog thread exits the rank (os._exit) when the trainer worker is gone or the
rank was re-parented (its torchrun died), also while the main thread waits in a collective;
a closed connection ends it between calls. torchrun itself ends when its ranks have.

Not here: starting or watching the group (trainer_group.py), the data-parallel sums
(rl/data_parallel.py).
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Client, Connection
from pathlib import Path

from rlpipe.workers.protocol import Ok, RankHello, RankReply, Stop, failed_from

GROUP_ENV = "RLPIPE_TRAINER_GROUP"
WATCH_INTERVAL_S = 0.2


def main() -> None:
    rank, world, local_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    spec = json.loads(Path(os.environ[GROUP_ENV]).read_text())
    connection = Client(spec["address"], family="AF_UNIX", authkey=bytes.fromhex(spec["authkey"]))
    _start_watchdog(int(spec["owner_pid"]))
    connection.send(RankHello(rank, os.getpid()))
    boot = connection.recv()

    try:
        service = _build(boot, rank, world, local_rank)
    except BaseException as exc:  # noqa: BLE001 - reported to the trainer worker, then exit
        connection.send(RankReply(failed_from(exc, traceback.format_exc()), True))
        os._exit(2)
    connection.send(RankReply(Ok(os.getpid()), False))
    _serve(connection, service)
    os._exit(0)


def _build(boot: dict, rank: int, world: int, local_rank: int):  # noqa: ANN202 - a TrainerService
    import torch
    import torch.distributed as dist

    from rlpipe.core.errors import ConfigError
    from rlpipe.rl.data_parallel import RankShare
    from rlpipe.workers.builders import config_from_bootstrap, resolve_device
    from rlpipe.workers.trainer_worker import TrainerService

    config = config_from_bootstrap(boot)
    on_cuda = resolve_device(config.model.device).startswith("cuda")
    if on_cuda:  # one GPU per rank
        if world > torch.cuda.device_count():  # every rank says so, none waits for a peer that never joins
            raise ConfigError(f"cluster.trainer_nproc = {world} ranks, but this machine has {torch.cuda.device_count()} GPUs "
                              "(NCCL needs one per rank)", "set cluster.trainer_nproc to at most the GPU count")
        torch.cuda.set_device(local_rank)
        config = config.model_copy(update={"model": config.model.model_copy(update={"device": f"cuda:{local_rank}"})})
    dist.init_process_group("nccl" if on_cuda else "gloo", timeout=timedelta(seconds=config.cluster.trainer_timeout_s))
    return TrainerService(boot["run_id"], config, RankShare(rank, world))


def _serve(connection: Connection, service) -> None:  # noqa: ANN001 - a TrainerService
    with connection:
        while True:
            try:
                call = connection.recv()
            except (EOFError, OSError):
                return  # the trainer worker is done with the group (or gone)
            if isinstance(call, Stop):
                return
            try:
                if call.sync_first:
                    _sync_from_rank0(service)
                reply = Ok(service.handle(call.request))
            except Exception as exc:  # noqa: BLE001 - every error goes back to the trainer worker
                reply = failed_from(exc, traceback.format_exc())
            try:
                connection.send(RankReply(reply, service.poisoned))
            except (EOFError, OSError):
                return


def _sync_from_rank0(service) -> None:  # noqa: ANN001 - a TrainerService
    """Rank 0's weights, optimizer state and policy version on every rank (collective)."""
    from rlpipe.rl.data_parallel import broadcast_object

    service.trainer.broadcast_state()
    service.policy_version = broadcast_object(service.policy_version, next(service.trainer.model.parameters()).device)
    service.weights_generation += 1


def _start_watchdog(owner_pid: int) -> None:
    from rlpipe.workers.server import owner_alive

    launcher = os.getppid()

    def watch() -> None:
        while os.getppid() == launcher and owner_alive(owner_pid, launcher):
            time.sleep(WATCH_INTERVAL_S)
        os._exit(0)

    threading.Thread(target=watch, name="trainer-worker-watchdog", daemon=True).start()


if __name__ == "__main__":
    main()
