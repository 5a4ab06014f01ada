"""Entry point of a worker process: `python -m rlpipe.workers.main --kind engine|trainer
--run-id RUN` (the arguments only name the process in `ps`; everything else arrives on stdin,
see server.py). A trainer worker with cluster.trainer_nproc > 1 only relays to its torchrun
group (trainer_group.py) and imports no torch itself."""

from __future__ import annotations

import argparse
import os

from rlpipe.core.config import RunConfig
from rlpipe.workers.server import run_worker


def build_service(boot: dict):  # noqa: ANN201 - a Service
    if boot["kind"] == "trainer":
        config = RunConfig.model_validate_json(boot["config_json"])  # no torch here: a relay never needs it
        if config.cluster.trainer_nproc > 1:  # the update runs in a torchrun group this worker starts and relays to
            from rlpipe.workers.trainer_group import TrainerGroupService

            return TrainerGroupService(boot, config)
    from rlpipe.workers.builders import config_from_bootstrap

    config = config_from_bootstrap(boot)
    _split_cpu_threads(config)
    if boot["kind"] == "engine":
        from rlpipe.workers.engine_worker import EngineService

        return EngineService(boot["run_id"], config, boot["socket_folder"])
    from rlpipe.workers.trainer_worker import TrainerService

    return TrainerService(boot["run_id"], config)


def _split_cpu_threads(config) -> None:  # noqa: ANN001 - a RunConfig
    """Async runs on CPU: the engine and the trainer work at the same time, so each worker
    takes half the cores instead of torch's default of all (which would make both thrash).
    OMP_NUM_THREADS, when set, decides instead."""
    if config.rollout.max_staleness == 0 or "OMP_NUM_THREADS" in os.environ:
        return
    import torch

    if config.model.device == "cpu" or (config.model.device == "auto" and not torch.cuda.is_available()):
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", choices=("engine", "trainer"), required=True)
    parser.add_argument("--run-id", required=True)
    parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_worker(build_service)


if __name__ == "__main__":
    main()
