"""Entry point of a worker process: `python -m rlpipe.workers.main --kind engine|trainer
--run-id RUN` (the arguments only name the process in `ps`; everything else arrives on stdin,
see server.py)."""

from __future__ import annotations

import argparse
import os

from rlpipe.workers.server import run_worker


def build_service(boot: dict):  # noqa: ANN201 - a Service
    from rlpipe.workers.builders import config_from_bootstrap

    config = config_from_bootstrap(boot)
    if boot["kind"] == "engine":
        from rlpipe.workers.engine_worker import EngineService

        return EngineService(boot["run_id"], config, boot["socket_folder"])
    from rlpipe.workers.trainer_worker import TrainerService

    return TrainerService(boot["run_id"], config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", choices=("engine", "trainer"), required=True)
    parser.add_argument("--run-id", required=True)
    parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_worker(build_service)


if __name__ == "__main__":
    main()
