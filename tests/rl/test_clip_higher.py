"""DAPO's clip-higher (`algo.clip_eps_high`) in a real update: the config reaches the
trainer, and tokens of a second mini-batch whose ratios rose past 1 + clip_eps are clipped
with the symmetric range and trained on with the wider one (rl/losses.py has the hand-computed cases)."""

import copy

import torch

from rlpipe.core.config import load_config
from rlpipe.engines.hf import HFEngine
from rlpipe.engines.sampling import SamplingParams
from rlpipe.rl.batching import TrainSample
from rlpipe.rl.trainer import Trainer
from rlpipe.workers.builders import build_trainer


def test_the_config_reaches_the_trainer(tiny_model):
    assert build_trainer(load_config(None, ["algo.clip_eps_high=0.28"]), tiny_model).clip_eps_high == 0.28
    assert build_trainer(load_config(None, []), tiny_model).clip_eps_high is None  # symmetric by default


def test_the_wider_upper_side_trains_tokens_the_symmetric_range_clips(tiny_model, tokenizer):
    completions = HFEngine(tiny_model, tokenizer).generate([("a", "1+2="), ("b", "reverse ab=")],
                                                           SamplingParams(n=8, max_new_tokens=4, seed=0))
    samples = [TrainSample(c.prompt_token_ids, c.token_ids, c.logprobs, 1.0) for c in completions]  # every A > 0

    def update(clip_eps_high):
        model = copy.deepcopy(tiny_model)
        trainer = Trainer(model, lr=1e-2, micro_batch_size=8, mini_batches_per_step=2, clip_eps=0.01, clip_eps_high=clip_eps_high)
        metrics = trainer.update(samples, shuffle_seed=0)
        return metrics, torch.cat([p.detach().flatten() for p in model.parameters()])

    symmetric, symmetric_weights = update(None)
    higher, higher_weights = update(100.0)
    # the first optimizer step moved the weights, so the second mini-batch's ratios rose: the
    # symmetric range (1 +- 0.01) clips some of its tokens (about a third here), a range that
    # wide above clips none
    assert symmetric.clip_frac > 0.0
    assert higher.clip_frac == 0.0
    assert not torch.equal(symmetric_weights, higher_weights)


def test_a_set_clip_eps_high_changes_the_config_hash():
    # set, it changes what a run computes (even at clip_eps's value); unset, config.py leaves it
    # out of the hash, so a run from before the key resumes under the hash it was stored with
    default = load_config(None)
    assert load_config(None, ["algo.clip_eps_high=0.2"]).config_hash() != default.config_hash()  # = clip_eps, yet set
