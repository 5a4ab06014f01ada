"""Run in a fresh process by test_checkpoint_reload.py: load a checkpoint's policy folder with
plain transformers (AutoModelForCausalLM, AutoTokenizer) and measure held-out accuracy the way the train flow's `evaluate` does
(greedy pass@1 on the run's held-out tasks). Prints one JSON line.

    python -m tests.durability.eval_checkpoint POLICY_FOLDER CONFIG_JSON_FILE
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlpipe.controller.sample import build_mixture
from rlpipe.core.config import RunConfig
from rlpipe.engines.hf import HFEngine
from rlpipe.engines.sampling import SamplingParams


def heldout_accuracy(folder: Path, config: RunConfig) -> dict[str, float]:
    """Greedy pass@1 of the policy folder on the config's held-out tasks: `accuracy` and
    `accuracy/<domain>` (benchmarks/async.py's curve calls it too)."""
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model.eval()
    mixture = build_mixture(config)
    heldout = mixture.heldout(config.envs.heldout_size, seed=config.envs.heldout_seed)
    # plain transformers can run it: one forward pass, finite logits over the vocabulary
    ids = tokenizer(heldout[0].prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape[-1] == len(tokenizer) and torch.isfinite(logits).all()
    engine = HFEngine(model, tokenizer, batch_size=config.rollout.batch_size)
    params = SamplingParams(
        n=1, temperature=1.0, top_p=1.0, max_new_tokens=config.rollout.max_new_tokens,
        stop=config.rollout.stop, seed=0, greedy=True,
    )
    completions = engine.generate([(task.task_id, task.prompt) for task in heldout], params)
    by_id = {task.task_id: task for task in heldout}
    passed: dict[str, list[float]] = defaultdict(list)
    for completion in completions:
        task = by_id[completion.task_id]
        verdict = mixture.env_for(task).verify(task, completion.text)
        passed[task.domain].append(1.0 if verdict.passed else 0.0)
    every = [value for values in passed.values() for value in values]
    result = {"accuracy": sum(every) / len(every)}
    result.update({f"accuracy/{domain}": sum(v) / len(v) for domain, v in sorted(passed.items())})
    return result


def main(folder: Path, config_file: Path) -> None:
    print(json.dumps(heldout_accuracy(folder, RunConfig.model_validate_json(config_file.read_text()))))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
