"""The trainer frees the gradients right after each optimizer step (rl/trainer.py): the
memory they hold (1x the trained weights) is free for the engine and the next batch."""


from rlpipe.rl.batching import TrainSample
from rlpipe.rl.trainer import Trainer


def test_the_gradient_is_freed_after_the_step(tiny_model, tokenizer):
    sample = TrainSample((5, 6), (7, 8), (-1.0, -1.0), 1.0)
    trainer = Trainer(tiny_model, lr=1e-2)
    assert trainer.update([sample]).grad_norm > 0
    assert all(parameter.grad is None for parameter in trainer.model.parameters())
