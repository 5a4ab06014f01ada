"""The memory reference of benchmarks/long_run.py: the work of an RL step in ONE plain PyTorch
process. `python benchmarks/plain_step.py CONFIG [--set KEY=VALUE ...] [--steps N]`.

The same model as the run (rlpipe's build_policy: model.gguf's converted HF folder, or the
tiny default model, in model.dtype), the same prompts (the mixture's train tasks, encoded as
the engines do: engines/sampling.encode_prompt), and per step: HF `generate` of
rollout.prompts_per_step x rollout.group_size samples of rollout.max_new_tokens at
rollout.temperature (no grad), rewards from the env's verifier, group-relative advantages,
then train.mini_batches_per_step mini-batches of forward + backward of the token-mean
policy-gradient loss over the completion positions, gradient clip 1.0 and torch's fused AdamW
step at train.lr (every step, whatever the advantages, so the optimizer's state exists). One
model serves both generation and training: no engine copy, no weight sync, no lake, no
Prefect, no MLflow. Its peak is what the run's processes are compared with; the parent
(long_run.py) polls its PSS, and it prints its own VmHWM at the end.

What it does not: learn anything worth keeping (no KV sharing, no skipped zero-advantage
groups, no clipping ratio: one plain loop), or write anything.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlpipe.controller.sample import build_mixture  # noqa: E402
from rlpipe.core.config import load_config  # noqa: E402
from rlpipe.engines.sampling import encode_prompt  # noqa: E402
from rlpipe.workers.builders import build_policy  # noqa: E402


def _vmhwm_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024**2
    return float("nan")


def _left_padded(rows: list[tuple[int, ...]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, width - len(row):] = torch.tensor(row)
        mask[index, width - len(row):] = 1
    return ids, mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=2, help="RL steps (the 2nd has the optimizer's state from the 1st)")
    args = parser.parse_args()
    config = load_config(args.config, args.overrides)
    torch.manual_seed(config.seed)
    model, tokenizer = build_policy(config)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.lr, weight_decay=0.0, fused=True)
    mixture, rollout = build_mixture(config), config.rollout
    for step in range(1, args.steps + 1):
        started = time.perf_counter()
        tasks = mixture.sample(rollout.prompts_per_step, rng_seed=config.seed * 1000 + step)
        prompts = [encode_prompt(tokenizer, task.prompt, config.model.prompt_format) for task in tasks]
        ids, mask = _left_padded(prompts, pad)
        model.eval()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=rollout.temperature,
                                 top_p=1.0, max_new_tokens=rollout.max_new_tokens, num_return_sequences=rollout.group_size,
                                 pad_token_id=pad)
        completions = out[:, ids.shape[1]:]
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        rewards = torch.tensor([mixture.env_for(tasks[i // rollout.group_size]).verify(tasks[i // rollout.group_size], text).reward or 0.0
                                for i, text in enumerate(texts)], dtype=torch.float32)
        grouped = rewards.view(len(tasks), rollout.group_size)
        advantages = (grouped - grouped.mean(dim=1, keepdim=True)).flatten()
        sequence_mask = torch.cat([mask.repeat_interleave(rollout.group_size, dim=0), (completions != pad).long()], dim=1)
        model.train()
        chunks = torch.arange(out.shape[0]).chunk(config.train.mini_batches_per_step)
        for rows in chunks:
            optimizer.zero_grad(set_to_none=True)
            logits = model(input_ids=out[rows], attention_mask=sequence_mask[rows]).logits[:, ids.shape[1] - 1:-1]
            logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, completions[rows].unsqueeze(-1)).squeeze(-1)
            tokens = (completions[rows] != pad).float()
            loss = -(advantages[rows].unsqueeze(1) * logp * tokens).sum() / tokens.sum().clamp(min=1)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        print(f"plain step {step}: {time.perf_counter() - started:.1f} s, reward mean {rewards.mean():.3f}, "
              f"VmHWM so far {_vmhwm_gib():.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
