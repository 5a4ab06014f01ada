"""Agent RL probe: does GRPO sharpen the copy of a warm-started agent policy? Minutes, no sandbox.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/agent_rl_probe.py --policy LAKE/checkpoints/RUN/step=000000/policy \
        [--lr 3e-4] [--steps 100] [--mask all|digit] [--temperature 0.6] [--warmup 0] [--keep-optimizer] [--kl 0] \
        [--prompts 8] [--group 8]

The agent quickstart's write turn alone (envs/agent_tasks.py tasks, each given the context it
has in an oracle episode: prompt, grep reply, `out: key=value`; no sandbox): per step 8
training tasks x 8 sampled write replies through rlpipe's HF engine, reward 1 iff the reply
writes the value, GRPO advantages per task, one update of rlpipe's Trainer (the quickstart's
micro-batch and 2 mini-batches), the weights loaded into the engine. Every 5 steps: the mean
reward and the greedy copy accuracy on 200 held-out tasks (chance 10 %). `--mask digit`
puts the loss on the value token only (is the format's drift the cause?), `--warmup N`
raises the lr linearly over N steps, `--keep-optimizer` starts from the checkpoint's saved
AdamW state (trainer/optimizer.pt: the warm start's second moments when the run had
warmstart.keep_optimizer) instead of a fresh AdamW, `--kl C` adds a KL penalty to the
checkpoint's policy, `--prompts`/`--group` size the step. Before the first step and after the
last it prints, per value seen in the tool's output, the policy's mean probability of each
digit as the first character of the content (at the sampling temperature, over the
held-out contexts with that value): which values the copy tells apart, and which it merges.
Nothing asserts: numbers are for reading.

Not measured: whole episodes (the grep and submit turns, the sandbox); `rlpipe train
configs/agent_quickstart.toml --set model.path=... --set warmstart.steps=0` measures those.
"""

from __future__ import annotations

import argparse
import json
import random

from pathlib import Path

import torch

from rlpipe.engines.hf import HFEngine
from rlpipe.engines.sampling import SamplingParams
from rlpipe.envs.agent_tasks import AgentTasksEnv
from rlpipe.rl.advantages import group_advantages
from rlpipe.rl.batching import TrainSample
from rlpipe.rl.checkpoint import load_trainer_state
from rlpipe.rl.checkpoint_layout import OPTIMIZER_FILE
from rlpipe.rl.policy import load_local_model
from rlpipe.rl.trainer import Trainer

PROMPTS, GROUP = 8, 8


def write_contexts(env: AgentTasksEnv, split: str, count: int) -> list[tuple[str, str, str]]:
    """(task id, context before the write reply, value) per task."""
    out = []
    for task in env.tasks(split, count, 0):
        grep = env.oracle_turns(task)[0]
        key = json.loads(grep)["arguments"]["command"].split()[2]
        files = json.loads(dict(task.metadata)["files"])
        line = [line for name in sorted(files) for line in files[name].splitlines() if line.startswith(key + "=")][0]
        out.append((task.task_id, task.prompt + grep + "\nout: " + line + "\n", json.loads(task.verifier.payload)["value"]))
    return out


def copied(text: str, value: str) -> bool:
    return f'"content":"{value}"' in text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", required=True, help="an HF folder: a warm-started checkpoint's policy/")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--mask", choices=("all", "digit"), default="all")
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--keep-optimizer", action="store_true", help="load the checkpoint's trainer/optimizer.pt")
    parser.add_argument("--prompts", type=int, default=PROMPTS, help="tasks per step")
    parser.add_argument("--group", type=int, default=GROUP, help="sampled replies per task")
    parser.add_argument("--kl", type=float, default=0.0, help="kl_coef: a KL penalty to the checkpoint's policy")
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = load_local_model(args.policy)
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    env = AgentTasksEnv()
    train, heldout = write_contexts(env, "train", 400), write_contexts(env, "heldout", 200)
    engine = HFEngine(model, tokenizer, batch_size=64, copy_model=True, device="cpu", dtype="float32", prompt_format="plain")
    trainer = Trainer(model, lr=args.lr, micro_batch_size=64, mini_batches_per_step=2, temperature=args.temperature,
                      kl_coef=args.kl)
    if args.keep_optimizer:
        saved = Path(args.policy).parent / OPTIMIZER_FILE
        trainer.load_state_dict(load_trainer_state(saved, str(saved)))
        for group in trainer.optimizer.param_groups:
            group["lr"] = args.lr

    def heldout_accuracy() -> float:
        params = SamplingParams(n=1, temperature=1.0, max_new_tokens=40, stop=("\n",), seed=0, greedy=True)
        completions = engine.generate([(task_id, context) for task_id, context, _ in heldout], params)
        return sum(copied(c.text, value) for c, (_, _, value) in zip(completions, heldout)) / len(heldout)

    digit_ids = [tokenizer.convert_tokens_to_ids(str(digit)) for digit in range(10)]

    def print_digit_distributions() -> None:
        """Rows: the value in the tool's output; columns: p(the content's first character)."""
        by_value: dict[str, list[torch.Tensor]] = {}
        with torch.no_grad():
            for _, context, value in heldout:
                ids = tokenizer(context + '{"arguments":{"content":"', return_tensors="pt").input_ids
                probabilities = torch.softmax(model(ids).logits[0, -1] / args.temperature, -1)[digit_ids]
                by_value.setdefault(value, []).append(probabilities)
        print("value | p(content digit 0..9) at the sampling temperature, mean over held-out contexts", flush=True)
        for value in sorted(by_value):
            mean = torch.stack(by_value[value]).mean(0).tolist()
            print(f"  {value}   | " + " ".join(f"{p:.2f}" for p in mean), flush=True)

    rng = random.Random(0)
    print_digit_distributions()
    print(f"lr={args.lr} mask={args.mask} temperature={args.temperature} warmup={args.warmup} "
          f"keep_optimizer={args.keep_optimizer} kl={args.kl}; "
          f"step 0 held-out copy {heldout_accuracy():.3f}", flush=True)
    for step in range(1, args.steps + 1):
        batch = rng.sample(train, args.prompts)
        params = SamplingParams(n=args.group, temperature=args.temperature, max_new_tokens=40, stop=("\n",), seed=step, greedy=False)
        completions = engine.generate([(task_id, context) for task_id, context, _ in batch], params)
        rewards = [float(copied(c.text, batch[index // args.group][2])) for index, c in enumerate(completions)]
        advantages = [a for g in range(args.prompts) for a in group_advantages(rewards[g * args.group:(g + 1) * args.group])]
        samples = []
        for completion, advantage in zip(completions, advantages):
            mask = None
            if args.mask == "digit":
                position = tokenizer.decode(completion.token_ids).find('"content":"') + len('"content":"')
                mask = tuple(int(index == position) for index in range(len(completion.token_ids)))
            samples.append(TrainSample(completion.prompt_token_ids, completion.token_ids, completion.logprobs, advantage,
                                       loss_mask=mask))
        for group in trainer.optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, step / args.warmup) if args.warmup else args.lr
        trainer.update(samples, shuffle_seed=step)
        engine.load_weights(model.named_parameters(), policy_version=step)
        if step % 5 == 0:
            print(f"step {step:4d}  reward {sum(rewards) / len(rewards):.3f}  held-out copy {heldout_accuracy():.3f}", flush=True)
    print_digit_distributions()


if __name__ == "__main__":
    main()
