"""Per-domain gradient conflict (rl/grad_conflict.py, Trainer.policy_gradient): cosines on
hand-checkable vectors and batches, and the update is the same with the measurement on or off."""

import copy
import dataclasses
import math

import pytest
import torch

from rlpipe.core.config import load_config
from rlpipe.rl.batching import TrainSample, pad_samples, token_logprobs
from rlpipe.rl.grad_conflict import gradient_conflict, pairwise_cosines
from rlpipe.rl.trainer import Trainer
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import StepManifest
from rlpipe.workers import weights
from tests.helpers.trajectories import make_trajectories


def test_pairwise_cosines_by_hand():
    gradients = {"b": torch.tensor([0.0, 1.0]), "a": torch.tensor([1.0, 0.0]), "c": torch.tensor([1.0, 1.0]),
                 "d": torch.tensor([-2.0, 0.0]), "zero": torch.tensor([0.0, 0.0])}
    cosines = pairwise_cosines(gradients)
    # a.b = 0; a.c = 1 / (1 x sqrt 2); a.d = -2 / (1 x 2) = -1; b.c = 1 / sqrt 2; b.d = 0; c.d = -2 / (sqrt 2 x 2)
    assert cosines == pytest.approx({"a__b": 0.0, "a__c": 1 / math.sqrt(2), "a__d": -1.0, "b__c": 1 / math.sqrt(2),
                                     "b__d": 0.0, "c__d": -1 / math.sqrt(2)})  # "zero" has no direction: no pair


# Completions of a few tokens after one prompt; advantages +1 / -1 alternate. The stored
# logprobs are arbitrary here (ratios far from 1): only the on-policy test below needs real ones.
BATCH = [TrainSample((5, 6, 7), (8 + i, 9, 10 + i), (-1.0, -2.0, -1.5), 1.0 if i % 2 == 0 else -1.0) for i in range(6)]


def on_policy(model, samples):
    """The samples with the model's own logprobs stored: every ratio is exactly 1, nothing clips."""
    batch = pad_samples(samples)
    with torch.no_grad():
        logprobs = token_logprobs(model.eval(), batch)
    return [dataclasses.replace(sample, old_logprobs=tuple(logprobs[row, 2:5].tolist())) for row, sample in enumerate(samples)]


def negated(samples):
    return [dataclasses.replace(sample, advantage=-sample.advantage) for sample in samples]


def test_identical_batches_point_the_same_way_and_negated_ones_opposite(tiny_model):
    trainer = Trainer(tiny_model, lr=1e-2, micro_batch_size=4)
    batch = on_policy(tiny_model, BATCH)
    doubled = [dataclasses.replace(sample, advantage=2 * sample.advantage) for sample in batch]
    conflict = gradient_conflict(trainer.policy_gradient, {"x": batch, "y": list(batch), "z": negated(batch), "w": doubled})
    # y = x: the same vector, cos 1; at ratio 1 the loss is -A x ratio, linear in A: z = -x (cos -1), w = 2x (cos 1)
    assert conflict["grad_conflict/x__y"] == pytest.approx(1.0, abs=1e-6)
    assert conflict["grad_conflict/x__z"] == pytest.approx(-1.0, abs=1e-6)
    assert conflict["grad_conflict/w__x"] == pytest.approx(1.0, abs=1e-6)


def test_one_domain_or_zero_advantages_give_no_pair(tiny_model):
    trainer = Trainer(tiny_model, lr=1e-2)
    assert gradient_conflict(trainer.policy_gradient, {"x": BATCH}) == {}
    flat = [dataclasses.replace(sample, advantage=0.0) for sample in BATCH]
    assert gradient_conflict(trainer.policy_gradient, {"x": BATCH, "y": flat}) == {}


def test_the_policy_gradient_is_the_gradient_the_update_clips(tiny_model):
    trainer = Trainer(copy.deepcopy(tiny_model), lr=1e-2, micro_batch_size=4)
    norm = float(torch.linalg.vector_norm(trainer.policy_gradient(BATCH)))
    # one mini-batch, no KL: the update's pre-clip gradient norm is this gradient's norm
    assert trainer.update(BATCH).grad_norm == pytest.approx(norm, rel=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # bf16: masters take the grads a stray backward would leave
def test_the_update_is_bit_identical_with_the_measurement_before_it(tiny_model, dtype):
    measured, plain = copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)
    with_conflict = Trainer(measured, lr=1e-2, micro_batch_size=4, dtype=dtype)
    without = Trainer(plain, lr=1e-2, micro_batch_size=4, dtype=dtype)
    for _ in range(2):
        gradient_conflict(with_conflict.policy_gradient, {"x": BATCH[:3], "y": BATCH[3:]})
        assert with_conflict.update(BATCH, shuffle_seed=1) == without.update(BATCH, shuffle_seed=1)
    assert all(torch.equal(a, b) for a, b in zip(measured.parameters(), plain.parameters()))


def test_the_trainer_worker_logs_the_conflict_and_updates_the_same(tmp_path):
    from rlpipe.workers.trainer_worker import TrainerService

    lake_uri = str(tmp_path / "lake")
    rows = make_trajectories("r", 1, 12, "arithmetic") + make_trajectories("r", 1, 12, "reverse")
    lake = Lake.open(lake_uri)
    part = lake.write_part("r", 1, "00000", rows)
    lake.commit_step(StepManifest(run_id="r", step=1, policy_version=0, parts=(part,), rows=len(rows), metrics=(), committed_at_ms=1))
    base = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
            f'storage.lake_uri="{lake_uri}"']
    on = TrainerService("r", load_config(None, [*base, "eval.grad_conflict_every_steps=1"]))
    off = TrainerService("r", load_config(None, base))
    metrics_on, metrics_off = on.update(1, (part,), 7).metrics, off.update(1, (part,), 7).metrics
    assert -1.0 <= metrics_on.pop("grad_conflict/arithmetic__reverse") <= 1.0
    assert metrics_on == metrics_off and "grad_conflict/arithmetic__reverse" not in metrics_off
    assert weights.digest(on.trainer.named_weights()) == weights.digest(off.trainer.named_weights())
