"""The synchronous weight sync in bounded chunks (workers/weight_stream.py, weights.py).

- chunk files: a plan of at most `chunk_bytes` per chunk (big tensors split by rows) written
  and copied back in place gives bit-equal tensors;
- with real workers: after a stream the engine holds the trainer's exact weights and version,
  and no chunk file is left; a stream cut after some chunks (the trainer dies, a chunk file
  vanishes, a generate arrives mid-stream) never lets the engine generate with the mixed
  weights: the call fails as EngineFailed (infra, retried) and the next call's fresh engine
  worker is synced fully.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlpipe.core.errors import EngineFailed
from rlpipe.engines.sampling import SamplingParams
from rlpipe.workers import protocol as p
from rlpipe.workers import weights
from rlpipe.workers.weight_stream import stream_weights
from tests.workers.workers_at_hand import train_a_little, worker_pair

CHUNK = 16 * 1024  # bytes: the tiny model (~100k parameters) streams in many chunks
PARAMS = SamplingParams(n=2, max_new_tokens=4, seed=3)
PROMPTS = [("t", "5+5=")]


def test_chunks_are_bounded_and_copy_back_bit_equal(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    source = {
        "big": torch.randn(100, 30, generator=generator),  # 100 rows x 120 bytes = 12000 bytes: split by rows
        "small": torch.randn(5, generator=generator),
        "scalar": torch.tensor(2.5),
        "half": torch.randn(7, 3, generator=generator).to(torch.bfloat16),
    }
    target = {name: torch.zeros_like(tensor) for name, tensor in source.items()}
    chunks = weights.plan_chunks(source.items(), chunk_bytes=1000)
    # big: 1000 // 120 = 8 rows a piece -> 13 pieces (12 of 8 rows, 1 of 4); each a chunk of its own
    assert [piece.stop - piece.start for chunk in chunks for piece in chunk if piece.name == "big"] == [8] * 12 + [4]

    def rows_view(name: str, first_row: int, shape: tuple[int, ...]) -> torch.Tensor:
        return target[name].narrow(0, first_row, shape[0]) if shape else target[name]

    for index, chunk in enumerate(chunks):
        path = tmp_path / f"chunk-{index}.safetensors"
        size = weights.write_chunk(source.items(), chunk, path, policy_version=3)
        assert size - path.stat().st_size == 0
        pieces = [source[x.name].narrow(0, x.start, x.stop - x.start) if source[x.name].dim() else source[x.name] for x in chunk]
        assert sum(piece.numel() * piece.element_size() for piece in pieces) <= 1000
        weights.load_chunk(path, rows_view)
        assert not path.exists()  # deleted once copied
    for name, tensor in source.items():
        assert torch.equal(target[name], tensor) and target[name].dtype == tensor.dtype


def test_a_stream_gives_the_engine_the_trainers_exact_weights_and_a_cut_one_never_serves(tmp_path: Path) -> None:
    with worker_pair(tmp_path) as (engine, trainer, shm):
        train_a_little(trainer)
        changed = trainer.digest()
        assert engine.digest() != changed
        streamed = stream_weights(trainer, engine, chunk_bytes=CHUNK)
        assert streamed.chunks > 1 and streamed.policy_version == 0 and engine.version() == 0
        assert engine.digest() == changed  # bit for bit
        assert list(shm.iterdir()) == []

        # cut after one chunk: the engine's weights are mixed; it refuses to generate and exits
        train_a_little(trainer)
        changed_again = trainer.digest()
        plan = trainer.call(p.BeginWeightStream(CHUNK))
        engine.call(p.BeginWeightLoad(plan.stream_id, plan.policy_version, plan.rows))
        first = trainer.call(p.PublishWeightChunk(plan.stream_id, 0, str(shm)))
        engine.call(p.LoadWeightChunk(plan.stream_id, first.path))
        mixed_pid = engine.pid
        with pytest.raises(EngineFailed, match="half-loaded"):
            engine.generate(PROMPTS, PARAMS)
        # the next call starts a fresh worker; its restart hook (controller/runtime.py's) syncs it
        engine.on_restart = lambda: stream_weights(trainer, engine, chunk_bytes=CHUNK)
        assert engine.digest() == changed_again and engine.pid != mixed_pid
        assert len(engine.generate(PROMPTS, PARAMS).completions) == 2

        # a chunk file that vanishes before the engine reads it: EngineFailed, the worker exits
        plan = trainer.call(p.BeginWeightStream(CHUNK))
        engine.call(p.BeginWeightLoad(plan.stream_id, plan.policy_version, plan.rows))
        for index in range(2):
            chunk = trainer.call(p.PublishWeightChunk(plan.stream_id, index, str(shm)))
            if index == 1:
                Path(chunk.path).unlink()
                vanished_pid = engine.pid
                with pytest.raises(EngineFailed, match="FileNotFoundError"):
                    engine.call(p.LoadWeightChunk(plan.stream_id, chunk.path))
            else:
                engine.call(p.LoadWeightChunk(plan.stream_id, chunk.path))
        assert engine.digest() == changed_again and engine.pid != vanished_pid  # fresh, synced by the hook
        assert list(shm.iterdir()) == []


def test_a_trainer_that_dies_mid_stream_fails_the_sync_and_a_retry_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLPIPE_FAILPOINTS", "trainer-weight-chunk@3")  # the trainer SIGKILLs itself writing chunk 3
    with worker_pair(tmp_path) as (engine, trainer, shm):
        initial = engine.digest()
        train_a_little(trainer)
        assert trainer.digest() != initial
        with pytest.raises(EngineFailed, match="died during PublishWeightChunk"):
            stream_weights(trainer, engine, chunk_bytes=CHUNK)
        assert engine.pid is None  # stopped by the failed sync: its two loaded chunks are never served
        # the retry: a fresh trainer (no lake here: the initial weights; a run restores it from
        # the lake) and a fresh engine; the sync gives the engine the trainer's weights
        streamed = stream_weights(trainer, engine, chunk_bytes=CHUNK)
        assert streamed.chunks > 2 and trainer.starts == 2 and engine.starts == 2
        assert engine.digest() == trainer.digest() == initial
        assert len(engine.generate(PROMPTS, PARAMS).completions) == 2
        assert list(shm.iterdir()) == []
