"""Hot weight sync: the trainer worker publishes one safetensors file on the run's weights
folder, the engine worker loads it; the engine then holds the trainer's exact weights (a
sha256 over every tensor's bytes), serves the published version, and the file is gone."""

from __future__ import annotations

from pathlib import Path

from tests.workers.workers_at_hand import train_a_little, worker_pair


def test_published_weights_give_the_engine_the_trainers_exact_weights(tmp_path: Path) -> None:
    with worker_pair(tmp_path) as (engine, trainer, shm):
        assert engine.digest() == trainer.digest()  # both built from the same seed
        # 3 supervised steps change the trainer's weights; the engine's stay the initial ones
        train_a_little(trainer)
        changed = trainer.digest()
        assert engine.digest() != changed
        published = trainer.publish_weights()
        assert Path(published.path).parent == shm and published.bytes > 0 and published.policy_version == 0
        assert engine.load_weights_file(published.path, 7) == 7  # the version it acknowledges
        Path(published.path).unlink()
        assert engine.digest() == changed  # bit for bit
        assert engine.version() == 7
        assert list(shm.iterdir()) == []
