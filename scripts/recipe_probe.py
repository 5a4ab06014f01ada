"""Recipe probe: does GRPO on a tiny CPU model raise held-out accuracy, and how fast?

A plain-Python loop (no Prefect, no storage, no MLflow) over the same parts the pipeline
uses: build a tiny model + char tokenizer, warm-start it on arithmetic reference answers,
measure held-out greedy pass@1, run GRPO steps (sample tasks x group completions with
HFEngine, verify, group advantages, Trainer.update, sync weights into the engine), measure
held-out pass@1 again. Prints per-step reward and timings, and a one-line JSON summary.

    .venv/bin/python scripts/recipe_probe.py --seed 0
    .venv/bin/python scripts/recipe_probe.py --seeds 0 1 2     # reproducibility

Defaults are the recipe found on a 2-core CPU machine (see the report in the PR / docs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlpipe.core.records import Task  # noqa: E402
from rlpipe.core.seeds import derive_seed  # noqa: E402
from rlpipe.engines.sampling import SamplingParams  # noqa: E402
from rlpipe.engines.hf import HFEngine  # noqa: E402
from rlpipe.envs.base import Env  # noqa: E402
from rlpipe.envs.mixture import build_env  # noqa: E402
from rlpipe.rl.advantages import group_advantages  # noqa: E402
from rlpipe.rl.policy import build_char_tokenizer, build_tiny_model  # noqa: E402
from rlpipe.rl.trainer import Trainer, TrainSample  # noqa: E402
from rlpipe.rl.warmstart import warm_start  # noqa: E402


@dataclass(frozen=True)
class ProbeResult:
    seed: int
    heldout_before: float
    heldout_after: float
    train_reward_first: float
    train_reward_last: float
    warmstart_s: float
    rl_s: float
    eval_s: float
    total_s: float


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--seeds", type=int, nargs="+", default=[0])
    add("--threads", type=int, default=2)
    # model.*
    add("--architecture", default="qwen2")
    add("--hidden-size", type=int, default=128)
    add("--num-layers", type=int, default=2)
    add("--num-heads", type=int, default=4)
    add("--intermediate-size", type=int, default=512)
    add("--max-position-embeddings", type=int, default=32)
    # envs.*
    add("--domain", default="reverse", choices=["arithmetic", "reverse"])
    add("--max-operand", type=int, default=99)
    add("--max-word-len", type=int, default=5)
    add("--train-size", type=int, default=4000)
    add("--heldout-size", type=int, default=200)
    # warmstart.*
    add("--warmstart-steps", type=int, default=130)
    add("--warmstart-batch-size", type=int, default=64)
    add("--warmstart-lr", type=float, default=3e-3)
    # rollout.*
    add("--prompts-per-step", type=int, default=32)
    add("--group-size", type=int, default=8)
    add("--max-new-tokens", type=int, default=6)
    add("--temperature", type=float, default=0.7)
    add("--top-p", type=float, default=1.0)
    add("--batch-size", type=int, default=256)
    # algo.* / train.*
    add("--advantage", default="grpo")
    add("--clip-eps", type=float, default=0.2)
    add("--kl-coef", type=float, default=0.0)
    add("--loss-agg", default="token_mean")
    add("--steps", type=int, default=400)
    add("--lr", type=float, default=1e-3)
    add("--weight-decay", type=float, default=0.0)
    add("--grad-clip", type=float, default=1.0)
    add("--micro-batch-size", type=int, default=256)
    add("--epochs-per-step", type=int, default=1)
    add("--mini-batches", type=int, default=1)
    add("--eval-every", type=int, default=0)
    add("--quiet", action="store_true")
    return parser.parse_args()


def evaluate(engine: HFEngine, env: Env, tasks: list[Task], max_new_tokens: int) -> float:
    """Greedy pass@1 on `tasks`."""
    params = SamplingParams(n=1, max_new_tokens=max_new_tokens, stop=("\n",), greedy=True)
    completions = engine.generate([(task.task_id, task.prompt) for task in tasks], params)
    return sum(bool(env.verify(task, completion.text).passed) for task, completion in zip(tasks, completions)) / len(tasks)


def rl_step(args: argparse.Namespace, seed: int, step: int, env: Env, engine: HFEngine, trainer: Trainer) -> tuple[float, str]:
    """One synchronous GRPO step; returns (mean reward, timing line)."""
    started = time.perf_counter()
    tasks = env.tasks("train", args.prompts_per_step, seed=derive_seed(seed, step, "tasks"))
    params = SamplingParams(
        n=args.group_size,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        stop=("\n",),
        seed=derive_seed(seed, step, "rollout"),
    )
    completions = engine.generate([(task.task_id, task.prompt) for task in tasks], params)
    generated = time.perf_counter()
    rewards = [env.verify(tasks[index // args.group_size], completion.text).reward for index, completion in enumerate(completions)]
    samples: list[TrainSample] = []
    for group_start in range(0, len(completions), args.group_size):
        group = completions[group_start : group_start + args.group_size]
        advantages = group_advantages(rewards[group_start : group_start + args.group_size], args.advantage)
        samples.extend(TrainSample(c.prompt_token_ids, c.token_ids, c.logprobs, advantage) for c, advantage in zip(group, advantages))
    metrics = trainer.update(samples)
    trained = time.perf_counter()
    engine.load_weights(trainer.named_weights(), policy_version=step + 1)
    synced = time.perf_counter()
    mean_reward = sum(r or 0.0 for r in rewards) / len(rewards)
    line = (
        f"step {step:3d} reward {mean_reward:.3f} loss {metrics.loss:+.4f} grad_norm {metrics.grad_norm:.3f} "
        f"clip {metrics.clip_frac:.3f} tokens {metrics.tokens} | gen {generated - started:.2f}s "
        f"train {trained - generated:.2f}s sync {synced - trained:.3f}s"
    )
    return mean_reward, line


def run(args: argparse.Namespace, seed: int) -> ProbeResult:
    started = time.perf_counter()
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        args.architecture, len(tokenizer), args.hidden_size, args.num_layers, args.num_heads,
        args.intermediate_size, args.max_position_embeddings, seed,
    )
    env = build_env(args.domain, max_operand=args.max_operand, max_word_len=args.max_word_len)
    heldout = env.tasks("heldout", args.heldout_size, seed=0)
    train_examples = [(task.prompt, task.reference_answer or "") for task in env.tasks("train", args.train_size, seed=seed)]

    losses = warm_start(model, tokenizer, train_examples, args.warmstart_steps, args.warmstart_batch_size, args.warmstart_lr, seed)
    warmstart_s = time.perf_counter() - started
    engine = HFEngine(model, tokenizer, batch_size=args.batch_size)
    eval_started = time.perf_counter()
    before = evaluate(engine, env, heldout, args.max_new_tokens)
    eval_s = time.perf_counter() - eval_started
    print(f"[seed {seed}] warm-start {args.warmstart_steps} steps, final loss {losses[-1] if losses else float('nan'):.3f}, "
          f"{warmstart_s:.1f}s; held-out greedy pass@1 {before:.3f}", flush=True)

    trainer = Trainer(
        model, lr=args.lr, weight_decay=args.weight_decay, grad_clip=args.grad_clip, micro_batch_size=args.micro_batch_size,
        epochs_per_step=args.epochs_per_step, mini_batches_per_step=args.mini_batches, clip_eps=args.clip_eps, kl_coef=args.kl_coef, loss_agg=args.loss_agg,
        pad_token_id=tokenizer.pad_token_id,
    )
    rl_started = time.perf_counter()
    rewards: list[float] = []
    for step in range(args.steps):
        reward, line = rl_step(args, seed, step, env, engine, trainer)
        rewards.append(reward)
        evaluated = bool(args.eval_every) and (step + 1) % args.eval_every == 0
        if evaluated:
            line += f" | held-out {evaluate(engine, env, heldout, args.max_new_tokens):.3f}"
        if evaluated or not args.quiet:
            print(f"[seed {seed}] {line}", flush=True)
    rl_s = time.perf_counter() - rl_started
    eval_started = time.perf_counter()
    after = evaluate(engine, env, heldout, args.max_new_tokens)
    eval_s += time.perf_counter() - eval_started
    window = max(1, min(5, len(rewards)))
    return ProbeResult(
        seed=seed,
        heldout_before=before,
        heldout_after=after,
        train_reward_first=sum(rewards[:window]) / window if rewards else 0.0,
        train_reward_last=sum(rewards[-window:]) / window if rewards else 0.0,
        warmstart_s=round(warmstart_s, 1),
        rl_s=round(rl_s, 1),
        eval_s=round(eval_s, 1),
        total_s=round(time.perf_counter() - started, 1),
    )


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    for seed in args.seeds:
        result = run(args, seed)
        print(
            f"[seed {seed}] held-out {result.heldout_before:.3f} -> {result.heldout_after:.3f} "
            f"({100 * (result.heldout_after - result.heldout_before):+.1f} pts); total {result.total_s:.1f}s",
            flush=True,
        )
        print("RESULT " + json.dumps(result.__dict__), flush=True)


if __name__ == "__main__":
    main()
