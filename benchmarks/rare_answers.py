"""How often a policy SAMPLES a right answer to the questions it never gets right greedily:
for training questions of one domain of a math recipe (drawn from the train split with a
seed of its own, never the held-out set), split by shape (terms, most digits, negative
answer), G samples per question at each temperature asked, as the recipe's rollouts ask
them (its template, chat format, first line of the reply), scored by the domain's own
verifier.

  .venv/bin/python benchmarks/rare_answers.py POLICY_FOLDER [--config configs/smollm2_math.toml]
      [--set a.b=c ...] [--domain rg_chain_sum] [--per-shape 40] [--samples 16] [--temperatures 0.7 1.0]

--set changes the config as `rlpipe train --set` does, so a domain the recipe does not ship
can be measured before a run adds it (envs.domains.NAME=1.0 plus envs.reasoning_gym.NAME={...}).

Prints, per (shape, temperature): questions, the share of samples right, the share that
write a negative answer at all (a minus sign right after the "="), and the share of
questions with at least one right sample among G (the groups GRPO can learn from: a group
of G with every reward 0 carries no signal), with the expected share for groups of G/2
drawn from the same samples (1 - C(G - k, G/2) / C(G, G/2) per question with k right).

What it does not: train, write anything, use the engine worker (plain HF sampling in
float32, top_p 1, BATCH questions x G samples a call), or say what a policy will learn; a figure is of one seed of sampling.
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
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from rlpipe.controller.sample import build_mixture  # noqa: E402
from rlpipe.core.config import load_config  # noqa: E402
from heldout_by_shape import shape  # noqa: E402 - benchmarks/, the same split by shape
from question_alone import chat_first_lines  # noqa: E402 - benchmarks/, the same batched chat replies

DRAW_SEED = 424242
BATCH = 10
NEGATIVE_AFTER_EQUALS = re.compile(r"=\s*-\s*\d")


def sampled_first_lines(model, tokenizer, prompts: list[str], samples: int, temperature: float, max_new_tokens: int) -> list[list[str]]:
    """`samples` replies to each prompt (chat template, left-padded, BATCH prompts a call), the
    first line of each, grouped by prompt."""
    lines = chat_first_lines(model, tokenizer, prompts, max_new_tokens, batch=BATCH, do_sample=True, temperature=temperature,
                             top_p=1.0, top_k=0, num_return_sequences=samples)
    return [lines[index:index + samples] for index in range(0, len(lines), samples)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policy", type=Path)
    parser.add_argument("--config", default=str(REPO / "configs" / "smollm2_math.toml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="a.b=c",
                        help="a config override, as `rlpipe train --set` (repeatable)")
    parser.add_argument("--domain", default="rg_chain_sum")
    parser.add_argument("--per-shape", type=int, default=40, help="questions per (terms, negative) kind")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args()
    if args.samples < 2 or args.samples % 2:
        raise SystemExit(f"--samples must be even and >= 2, got {args.samples}")
    config = load_config(args.config, args.overrides)
    mixture = build_mixture(config)
    if args.domain not in mixture.envs:
        raise SystemExit(f"--domain {args.domain!r} is not in {args.config} (domains: {sorted(mixture.envs)})")
    template = config.envs.reasoning_gym[args.domain].prompt_template if args.domain in config.envs.reasoning_gym else "{question}"
    env = mixture.envs[args.domain]
    kinds: dict[tuple[int, bool], list] = defaultdict(list)
    for task in env.tasks("train", 40 * args.per_shape, seed=DRAW_SEED):
        terms, _, negative = shape(task.prompt.removesuffix(template.partition("{question}")[2]), task.reference_answer)
        if len(kinds[(terms, negative)]) < args.per_shape:
            kinds[(terms, negative)].append(task)
    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.policy, dtype=torch.float32).eval()
    torch.manual_seed(0)
    half = args.samples // 2
    for (terms, negative), tasks in sorted(kinds.items()):
        for temperature in args.temperatures:
            groups = sampled_first_lines(model, tokenizer, [task.prompt for task in tasks], args.samples, temperature, args.max_new_tokens)
            right_counts = [sum(bool(env.verify(task, reply).passed) for reply in replies) for task, replies in zip(tasks, groups)]
            n = len(tasks)
            share = sum(right_counts) / (n * args.samples)
            signed = sum(bool(NEGATIVE_AFTER_EQUALS.search(reply)) for replies in groups for reply in replies) / (n * args.samples)
            spread = sum(0 < k for k in right_counts) / n
            spread_half = sum(1 - math.comb(args.samples - k, half) / math.comb(args.samples, half) for k in right_counts) / n
            print(f"{args.domain} terms {terms} {'negative' if negative else '>= 0    '} T {temperature:.1f}  n {n:3d}  "
                  f"samples right {share:.3f}  with '= -' {signed:.3f}  questions with a right sample of {args.samples} {spread:.3f} "
                  f"(of {half}: {spread_half:.3f})", flush=True)


if __name__ == "__main__":
    main()
