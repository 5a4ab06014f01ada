"""Where a math policy fails: greedy strict and format-free accuracy of a policy folder on a
recipe's held-out set, split by the question's shape (number of terms, most digits in a
term, and whether the answer is negative), asked exactly as the recipe asks (its template,
chat format).

  .venv/bin/python benchmarks/heldout_by_shape.py POLICY_FOLDER [--config configs/smollm2_math.toml] [--set a.b=c ...]

POLICY_FOLDER: an HF model folder (a checkpoint's step folder, `rlpipe export RUN DIR`, or the
converted GGUF folder beside models/smollm2/*.gguf). Prints one line per (domain, terms,
digits, sign): n, strict accuracy (the domain's own verifier on the reply's first line) with
its binomial standard error, format-free accuracy (envs/format_free.py).

What it does not: train, write anything, or use the engine worker (plain HF generate in
float32, batches of 50, so a figure here is comparable with itself across policies, not
with a run's bf16 evaluation to the last digit).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from rlpipe.controller.evaluation import heldout_tasks  # noqa: E402
from rlpipe.controller.sample import build_mixture  # noqa: E402
from rlpipe.core.config import load_config  # noqa: E402
from rlpipe.envs.format_free import format_free_passed  # noqa: E402
from question_alone import greedy_first_lines  # noqa: E402 - benchmarks/, the same batched greedy replies



def shape(question: str, answer: str) -> tuple[int, int, bool]:
    """(terms, most digits in a term, negative answer) of an arithmetic question's text."""
    numbers = re.findall(r"\d+", question)
    return len(numbers), max((len(number) for number in numbers), default=0), answer.strip().startswith("-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policy", type=Path)
    parser.add_argument("--config", default=str(REPO / "configs" / "smollm2_math.toml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="a.b=c",
                        help="a config override, as `rlpipe train --set` (repeatable): the run's own config")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args()
    config = load_config(args.config, args.overrides)
    templates = {name: spec.prompt_template for name, spec in config.envs.reasoning_gym.items()}
    mixture = build_mixture(config)
    tasks = heldout_tasks(config, mixture)
    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.policy, dtype=torch.float32).eval()
    outcomes: dict[tuple[str, int, int, bool], list[tuple[bool, bool]]] = defaultdict(list)
    replies = greedy_first_lines(model, tokenizer, [task.prompt for task in tasks], args.max_new_tokens)
    for task, reply in zip(tasks, replies):
        template = templates.get(task.domain, "{question}")
        question = task.prompt.removesuffix(template.partition("{question}")[2])
        strict = mixture.env_for(task).verify(task, reply).passed
        outcomes[(task.domain, *shape(question, task.reference_answer))].append((bool(strict), bool(format_free_passed(task, reply))))
    for (domain, terms, digits, negative), results in sorted(outcomes.items()):
        n = len(results)
        strict = sum(s for s, _ in results) / n
        free = sum(f for _, f in results) / n
        print(f"{domain:24s} terms {terms} digits {digits} {'negative' if negative else '>= 0    '}  n {n:4d}  "
              f"strict {strict:.3f} +- {math.sqrt(strict * (1 - strict) / n):.3f}  format-free {free:.3f}")


if __name__ == "__main__":
    main()
