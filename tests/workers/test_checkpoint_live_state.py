"""A checkpoint is written from the trainer's live tensors, so whatever changes them waits for
the write: the files of checkpoint s hold the state of step s, never a later step's.

The background write is held at its first file until something waits for it (the writer's
`join` or `wait`); a call that changed the weights without waiting would change them while
the write is held, so the checkpoint would be incomplete when its optimizer step ran and its
files would hold the later weights.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlpipe.core.config import load_config
from rlpipe.rl.checkpoint_layout import OPTIMIZER_FILE, WEIGHTS_FILE
from rlpipe.rl.batching import TrainSample
from rlpipe.rl.trainer import MASTER_WEIGHTS_KEY, Trainer
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import StepManifest
from rlpipe.workers import checkpoint_writer
from rlpipe.workers.builders import build_policy, build_trainer
from rlpipe.workers.protocol import WarmStartBegin, WarmStartWait
from rlpipe.workers.trainer_worker import TrainerService
from tests.helpers.trajectories import make_trajectories

SMALL = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64", "train.steps=5"]


def _held_writes(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Hold every background write at its first file until the writer is waited for (after
    `save` returned: the wait for the previous write inside `save` does not count); the
    second event is set once a write's files are all written."""
    waited, written = threading.Event(), threading.Event()
    saving = threading.local()
    real = checkpoint_writer.CheckpointWriter
    real_write, real_save, real_join, real_wait = checkpoint_writer.write_contents, real.save, real.join, real.wait

    def write(contents, open_file):
        @contextmanager
        def held(path: str):
            waited.wait()
            with open_file(path) as stream:
                yield stream
        real_write(contents, held)
        written.set()

    def save(self, *args, **kwargs):
        saving.inside = True
        try:
            real_save(self, *args, **kwargs)
        finally:
            saving.inside = False

    def waiting(method):
        def wrapped(self):
            if not getattr(saving, "inside", False):
                waited.set()
            method(self)
        return wrapped

    monkeypatch.setattr(checkpoint_writer, "write_contents", write)
    monkeypatch.setattr(real, "save", save)
    monkeypatch.setattr(real, "join", waiting(real_join))
    monkeypatch.setattr(real, "wait", waiting(real_wait))
    return waited, written


def _service(tmp_path: Path) -> tuple[TrainerService, tuple]:
    lake_uri = str(tmp_path / "lake")
    rows = make_trajectories("r", 2, 16)
    lake = Lake.open(lake_uri)
    part = lake.write_part("r", 2, "00000", rows)
    lake.commit_step(StepManifest(run_id="r", step=2, policy_version=1, parts=(part,), rows=len(rows), metrics=(), committed_at_ms=1))
    service = TrainerService("r", load_config(None, [*SMALL, f'storage.lake_uri="{lake_uri}"', "train.lr=0.01"]))
    service.policy_version = 1
    return service, (part,)


def _state_now(service: TrainerService) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in service.trainer.model.state_dict().items()}


def _checkpoint(service: TrainerService, step: int, folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    assert service.lake.load_checkpoint("r", step, folder) is not None
    return load_file(str(folder / WEIGHTS_FILE)), torch.load(folder / OPTIMIZER_FILE, weights_only=True)


def test_an_update_during_a_write_waits_and_the_files_hold_the_step_they_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    waited, written = _held_writes(monkeypatch)
    service, parts = _service(tmp_path)
    at_step_1 = _state_now(service)
    seen_at_optimizer_step: list[bool] = []
    real_step = service.trainer.optimizer.step

    def optimizer_step(*args, **kwargs):
        seen_at_optimizer_step.append(written.is_set())
        return real_step(*args, **kwargs)

    monkeypatch.setattr(service.trainer.optimizer, "step", optimizer_step)
    service.save(1, "h")  # returns with the write held
    updated = service.update(2, parts, shuffle_seed=3)
    assert updated.policy_version == 2
    waited.set()  # a design that never waited would leave the write held
    service.checkpoints.wait()
    assert seen_at_optimizer_step and all(seen_at_optimizer_step)  # every optimizer step came after the files
    assert updated.metrics["time/checkpoint_wait_s"] > 0  # the update reports the time the write held it
    assert service.checkpoints.take_waited_s() == 0  # counted once
    weights, state = _checkpoint(service, 1, tmp_path / "one")
    after = _state_now(service)
    assert any(not torch.equal(after[name], at_step_1[name]) for name in weights)  # the update did change them
    assert all(torch.equal(weights[name], at_step_1[name]) for name in weights)
    assert state["state"] == {}  # no optimizer step had run at step 1


def test_a_warm_start_during_a_write_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With its own optimizer (warmstart.keep_optimizer off) it changes the weights outside
    the Trainer: the trainer worker waits before it begins."""
    waited, _ = _held_writes(monkeypatch)
    service, _ = _service(tmp_path)
    before = _state_now(service)
    service.save(1, "h")
    request = WarmStartBegin(examples=(("1+1=", "2"), ("2+2=", "4")), steps=3, batch_size=2, lr=0.05, seed=0,
                             check_every=0, with_checks=False, keep_optimizer=False)
    service.handle(request)
    while service.handle(WarmStartWait(timeout_s=30.0)).state != "done":
        pass
    waited.set()
    service.checkpoints.wait()
    weights, state = _checkpoint(service, 1, tmp_path / "one")
    after = _state_now(service)
    assert any(not torch.equal(after[name], before[name]) for name in weights)
    assert all(torch.equal(weights[name], before[name]) for name in weights) and state["state"] == {}


def _tiny_trainer(dtype: str = "float32") -> Trainer:
    config = load_config(None, [*SMALL, "train.lr=0.01", f'model.dtype="{dtype}"'])
    policy, _ = build_policy(config)
    return build_trainer(config, policy)


def _everything(trainer: Trainer) -> list[torch.Tensor]:
    """Every tensor a checkpoint writes: the weights, the masters, the optimizer state."""
    tensors = [tensor.detach().clone() for tensor in trainer.model.state_dict().values()]
    for value in trainer.state_dict().get("state", {}).values():
        tensors += [tensor.clone() for tensor in value.values() if isinstance(tensor, torch.Tensor)]
    tensors += [master.clone() for master in trainer.state_dict().get(MASTER_WEIGHTS_KEY, [])]
    return tensors


def _same(first: list[torch.Tensor], second: list[torch.Tensor]) -> bool:
    return len(first) == len(second) and all(torch.equal(a, b) for a, b in zip(first, second))


def _samples() -> list[TrainSample]:
    return [TrainSample((5, 6, 7), (8 + i, 9, 10 + i), (-1.0, -2.0, -1.5), 1.0 if i % 2 == 0 else -1.0) for i in range(6)]


def _change(trainer: Trainer, how: str, other: Trainer) -> None:
    if how == "update":
        trainer.update(_samples(), shuffle_seed=1)
    elif how == "load_state_dict":
        trainer.load_state_dict(other.state_dict())
    elif how == "drop_momentum":
        trainer.drop_momentum()
    elif how == "warm_start_optimizer":
        optimizer, weights = trainer.warm_start_optimizer()
        for tensor in weights.stepped:
            tensor.grad = torch.ones_like(tensor)
        optimizer.step()


@pytest.mark.parametrize("how", ["update", "load_state_dict", "drop_momentum", "warm_start_optimizer"])
def test_every_change_of_the_trainer_state_calls_the_hook_first(how: str) -> None:
    """The hook sees the state as it was before the call (nothing changed yet), and the call
    does change it afterwards."""
    trainer, other = _tiny_trainer(), _tiny_trainer()
    for ready in (trainer, other):  # AdamW moments to change and to load
        ready.update(_samples(), shuffle_seed=0)
    other.update(_samples(), shuffle_seed=2)
    before = _everything(trainer)
    unchanged_at_hook: list[bool] = []
    trainer.before_state_change = lambda: unchanged_at_hook.append(_same(_everything(trainer), before))
    _change(trainer, how, other)
    assert unchanged_at_hook and unchanged_at_hook[0]
    assert not _same(_everything(trainer), before)


def test_stale_masters_are_reread_only_after_the_hook() -> None:
    """A bf16 policy whose weights changed outside the trainer: the update re-reads its fp32
    masters, a change of checkpointed state that must wait too."""
    trainer = _tiny_trainer("bfloat16")
    masters_before = [master.clone() for master in trainer.state_dict()[MASTER_WEIGHTS_KEY]]
    with torch.no_grad():
        for parameter in trainer.model.parameters():
            parameter.add_(1.0)
    masters_at_hook: list[bool] = []
    trainer.before_state_change = lambda: masters_at_hook.append(
        _same([master.clone() for master in trainer.state_dict()[MASTER_WEIGHTS_KEY]], masters_before))
    trainer.update(_samples(), shuffle_seed=1)
    assert masters_at_hook and masters_at_hook[0]
