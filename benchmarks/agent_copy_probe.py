"""Agent copy probe: does a tiny from-scratch model learn to COPY the value from the tool's
output, on the agent quickstart's tasks, and which loss schedule lets it? Minutes, no sandbox.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/agent_copy_probe.py \
        [--loss reply|value|value-then-reply] [--switch-step 50] [--steps 200] [--layers 2] ...

The data are the oracle's write replies of envs/agent_tasks.py tasks (1-digit values, 2-3
files), each given the context it has in a real oracle episode: the prompt, the grep reply
and its observation (`out: port=4`, built as agents/episodes.py builds it: grep's output of
the task's files, so no sandbox is needed). Training uses `envs.train_size`-like TRAIN tasks;
the probe is HELD-OUT tasks of the env's own split (disjoint by their files). The model is the
quickstart's tiny Qwen2-architecture model (rl/policy.py's build_tiny_model, the char tokenizer).

Losses, per step of `--batch` write replies (AdamW, constant lr, grad norm clipped to 1.0):
- reply: mean over every token of the reply (what the warm start does: rl/warmstart.py);
- value: the value token only;
- value-then-reply: `value` up to --switch-step, then `reply` (a copy-first curriculum).

Printed every --every steps: the training loss, and on 200 held-out write replies the
teacher-forced accuracy of the value token (argmax; chance is 10%) and its mean NLL
(ln 10 = 2.30 is a uniform guess over the digits). Nothing asserts: numbers are for reading.

Not measured: whole episodes (the grep and submit replies, greedy decoding, the sandbox) or RL;
`rlpipe train configs/agent_quickstart.toml` measures those.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from rlpipe.envs.agent_tasks import AgentTasksEnv
from rlpipe.rl.policy import build_char_tokenizer, build_tiny_model


def write_examples(env: AgentTasksEnv, split: str, count: int, seed: int) -> list[tuple[str, str, str]]:
    """(context before the write reply, the write reply + newline, the value) per task."""
    examples = []
    for task in env.tasks(split, count, seed):
        grep, write, _submit = env.oracle_turns(task)
        key = json.loads(grep)["arguments"]["command"].split()[2]
        files = json.loads(dict(task.metadata)["files"])
        lines = [line for name in sorted(files) for line in files[name].splitlines() if key in line]
        context = task.prompt + grep + "\n" + "out: " + " ".join(lines) + "\n"
        examples.append((context, write + "\n", json.loads(task.verifier.payload)["value"]))
    return examples


def encode(tokenizer, examples: list[tuple[str, str, str]]) -> tuple[torch.Tensor, int, int]:
    """Token ids [n, length] (every example has the same length: keys are 4 characters), the
    index of the first reply token and of the value token."""
    ids = [tokenizer(context + reply, add_special_tokens=False)["input_ids"] for context, reply, _ in examples]
    if len({len(row) for row in ids}) != 1:
        raise ValueError("examples differ in length; the probe needs same-length episodes")
    context, reply, _ = examples[0]
    first = len(tokenizer(context, add_special_tokens=False)["input_ids"])
    value = first + len(tokenizer(reply[:reply.index('"content":"') + len('"content":"')], add_special_tokens=False)["input_ids"])
    return torch.tensor(ids), first, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loss", choices=("reply", "value", "value-then-reply"), default="reply")
    parser.add_argument("--switch-step", type=int, default=50)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--train-tasks", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    env = AgentTasksEnv()
    tokenizer = build_char_tokenizer()
    train, first, value = encode(tokenizer, write_examples(env, "train", args.train_tasks, args.seed))
    heldout, _, _ = encode(tokenizer, write_examples(env, "heldout", 200, args.seed))
    model = build_tiny_model("qwen2", len(tokenizer), args.hidden, args.layers, args.heads, 4 * args.hidden, 320, args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    rng = random.Random(args.seed)
    started, cpu_started = time.time(), time.process_time()
    print(f"loss={args.loss} layers={args.layers} heads={args.heads} hidden={args.hidden} lr={args.lr} batch={args.batch}")
    for step in range(1, args.steps + 1):
        model.train()
        batch = train[[rng.randrange(len(train)) for _ in range(args.batch)]]
        logits = model(input_ids=batch[:, :-1]).logits  # position j predicts token j + 1
        value_only = args.loss == "value" or (args.loss == "value-then-reply" and step <= args.switch_step)
        start = value if value_only else first
        end = value + 1 if value_only else batch.shape[1]
        loss = torch.nn.functional.cross_entropy(logits[:, start - 1:end - 1].reshape(-1, logits.shape[-1]),
                                                 batch[:, start:end].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % args.every == 0 or step == args.steps:
            model.eval()
            with torch.no_grad():
                value_logits = model(input_ids=heldout[:, :value]).logits[:, -1]
            target = heldout[:, value]
            accuracy = (value_logits.argmax(-1) == target).float().mean().item()
            nll = -torch.log_softmax(value_logits, -1)[torch.arange(len(target)), target].mean().item()
            print(f"step {step:4d}  train loss {loss.item():.3f}  held-out value accuracy {accuracy:.3f}  value NLL {nll:.3f}  "
                  f"wall {time.time() - started:.0f} s  cpu {time.process_time() - cpu_started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
