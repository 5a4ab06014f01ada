"""The run's weight-sync folder on /dev/shm is private and unpredictable: mode 0700 under a
random name (workers/shm.py), so what another user planted at the run's old predictable
name, /dev/shm/rlpipe-<run id>, neither blocks a run nor receives its weights; the run finds
its folder by the recorded path, and removes it at the end.

What it does not: test the watchdog's removal after a killed controller (test_no_orphans.py).
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from rlpipe.workers.shm import create_weights_folder, folder_prefix, shm_base


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_folder_is_private_new_and_named_after_the_run() -> None:
    first, second = create_weights_folder("run/1"), create_weights_folder("run/1")
    try:
        assert _mode(first) == _mode(second) == 0o700
        assert first != second and list(first.iterdir()) == []
        assert first.parent == shm_base() and first.name.startswith(folder_prefix("run/1"))
        assert "/" not in first.name.removeprefix("rlpipe-")  # the run id cannot climb out of the base
    finally:
        first.rmdir()
        second.rmdir()


@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")  # MLflow's, as elsewhere
def test_a_run_starts_past_a_link_planted_at_the_old_name_and_sends_it_nothing(tmp_path: Path) -> None:
    """A symlink at /dev/shm/rlpipe-<run id> made the old `rmtree` + `mkdir` fail (rmtree
    refuses links, even as root; mkdir then found the name taken): the run could not start."""
    from rlpipe.controller.launch import build_runtime
    from rlpipe.controller.weight_sync import sync_weights
    from tests.helpers.mlflow_db import seed_mlflow_db
    from tests.workers.workers_at_hand import tiny_config

    run_id = f"planted-{tmp_path.name}"
    elsewhere = tmp_path / "the-planters-folder"
    elsewhere.mkdir()
    planted = shm_base() / f"rlpipe-{run_id}"
    planted.symlink_to(elsewhere)
    seed_mlflow_db(tmp_path / "mlflow.db")
    try:
        runtime = build_runtime(run_id, tiny_config(tmp_path))
        try:
            folder = runtime.workers.weights_folder
            assert folder != planted and _mode(folder) == 0o700
            assert runtime.workers.engine.spec.weights_folder == runtime.workers.trainer.spec.weights_folder == folder
            sync_weights(runtime)  # the trainer's weights reach the engine through the folder
            assert runtime.workers.engine.digest() == runtime.workers.trainer.digest()
        finally:
            runtime.close()  # stops the workers and removes the folder
        assert not folder.exists() and list(elsewhere.iterdir()) == []
    finally:
        planted.unlink()
