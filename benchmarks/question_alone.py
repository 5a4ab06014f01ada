"""Skill apart from format: greedy format-free accuracy of a policy folder on a recipe's
held-out set with each question asked ALONE (the domains' prompt_template dropped), so a
gain learned under the recipe's instruction ("Answer with only the equation, ...") can be
told apart from a gain of the arithmetic itself.

  .venv/bin/python benchmarks/question_alone.py POLICY_FOLDER [--config configs/smollm2_math.toml]
      [--max-new-tokens 16] [--with-template]

POLICY_FOLDER: an HF model folder (a checkpoint's policy, `rlpipe export RUN DIR`, or the
converted GGUF folder beside models/smollm2/*.gguf). Prints, per domain: n, format-free
accuracy and its binomial standard error (envs/format_free.py on the reply's first line).
The held-out set is the recipe's own (controller/evaluation.py `heldout_tasks`), in chat
format, greedy, batches of 50 through HF generate.

What it does not: train, write anything, or use the engine worker (plain HF generate, so
a figure here is comparable with itself across policies, not with the run's own evaluation
to the last digit).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from rlpipe.controller.evaluation import heldout_tasks  # noqa: E402
from rlpipe.controller.sample import build_mixture  # noqa: E402
from rlpipe.core.config import load_config  # noqa: E402
from rlpipe.envs.format_free import format_free_passed  # noqa: E402

BATCH = 50


def question_alone(prompt: str, template: str) -> str:
    """The dataset's question: `prompt` with what the template put around {question} removed."""
    before, _, after = template.partition("{question}")
    return prompt.removeprefix(before).removesuffix(after)


def chat_first_lines(model, tokenizer, prompts: list[str], max_new_tokens: int, batch: int = BATCH,
                     **sampling) -> list[str]:
    """Each prompt asked as the user's turn of the chat template, `batch` prompts at a time
    (left-padded), generated with `sampling` (model.generate's options); the first line of
    every returned sequence, in order (num_return_sequences rows per prompt, one after another)."""
    replies = []
    for start in range(0, len(prompts), batch):
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
                 for prompt in prompts[start:start + batch]]
        encoded = tokenizer(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**encoded, max_new_tokens=max_new_tokens, **sampling,
                                 pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
        replies += [tokenizer.decode(row[encoded.input_ids.shape[1]:], skip_special_tokens=True).split("\n")[0] for row in out]
    return replies


def greedy_first_lines(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[str]:
    """The first line of each prompt's greedy reply (chat_first_lines)."""
    return chat_first_lines(model, tokenizer, prompts, max_new_tokens, do_sample=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policy", type=Path)
    parser.add_argument("--config", default=str(REPO / "configs" / "smollm2_math.toml"))
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--with-template", action="store_true", help="ask as the recipe does (the control)")
    args = parser.parse_args()
    config = load_config(args.config)
    templates = {name: spec.prompt_template for name, spec in config.envs.reasoning_gym.items()}
    tasks = heldout_tasks(config, build_mixture(config))
    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.policy, dtype=torch.float32).eval()
    passed: dict[str, list[bool]] = defaultdict(list)
    prompts = [task.prompt if args.with_template or task.domain not in templates
               else question_alone(task.prompt, templates[task.domain]) for task in tasks]
    for task, reply in zip(tasks, greedy_first_lines(model, tokenizer, prompts, args.max_new_tokens)):
        passed[task.domain].append(bool(format_free_passed(task, reply)))
    mode = "with the recipe's template" if args.with_template else "question alone"
    for domain, outcomes in sorted(passed.items()):
        accuracy = sum(outcomes) / len(outcomes)
        print(f"{domain:24s} n {len(outcomes):4d}  format-free {accuracy:.3f} +- {math.sqrt(accuracy * (1 - accuracy) / len(outcomes)):.3f}  ({mode})")


if __name__ == "__main__":
    main()
