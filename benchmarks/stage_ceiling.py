"""rlpipe's stages beside the best the same library does alone, on the same batch, in one run:

    PYTHONPATH=$PWD nice -n 19 .venv/bin/python benchmarks/stage_ceiling.py [CONFIG] [--engine vllm|hf]
        [--reps 3] [--max-new-tokens 16] [--parts generate,update] [--update-prompts N] [--set KEY=VALUE ...]

As measured (docs/RESULTS.md, "rlpipe's stages beside the library alone"):
`--engine vllm --reps 3 --update-prompts 4`, `--engine vllm --reps 2 --parts update`,
`--engine hf --reps 2 --update-prompts 4`.

CONFIG (default configs/smollm2_math.toml; `make smollm2` first; vllm needs `make venv-vllm`)
gives the model, the prompts (its mixture), the sampling settings and the trainer's settings.
The run's two workers are started as `rlpipe train` starts them (controller/launch.py
build_runtime: the engine worker in the engine's interpreter, the trainer worker), beside the
library alone in a process of its own (benchmarks/stage_ceiling_alone.py). Then:

1. Generation: per repetition a fresh draw of rollout.prompts_per_step tasks (prefix caches
   do not carry over), group_size samples each. rlpipe: the `generate` stage
   (controller/generate.py: the engine worker's Generate call, as each RL step makes it).
   Alone (vllm): the library's own LLM.generate on the same prompt token ids, in two processes:
   `alone-same` (the LLM settings and the request rlpipe's engine makes: the same per-prompt
   seeds and sampled-token logprobs; its samples must equal rlpipe's, checked) and
   `alone-default` (vLLM's default chunked prefill, no seeds, no logprobs: text only).
   Alone (hf): `alone-default`, transformers' own model.generate on the same prompts.
2. Update: the rows of one generation, with advantages +-1 (every sample trains; what the
   advantages are does not change the work), committed to the lake as a step, then:
   rlpipe: the `update` stage (controller/update.py: the trainer worker reads the rows back
   from the lake and runs Trainer.update); in-process: Trainer.update built as the worker
   builds it (workers/builders.py), in this process, on the same samples; plain: a PyTorch
   loop on the same samples in the same shuffled mini-batches and micro-batches: forward (the
   LM head on the completion positions only), logprob gather - logsumexp at the temperature,
   token-mean policy-gradient loss, backward, grad clip, fused AdamW step. The in-process
   Trainer and the plain loop share this process's model (each with its own AdamW).

Memory: the vllm generation part holds three vLLM engines (the worker's and two alone, ~2.7 GB
each); the update part, this process's model with two AdamW states plus a micro-batch's
activations (8.6 GB resident measured with micro-batches of 32 samples of ~80 tokens, float32)
beside the trainer worker's.

Repetitions interleave (the order rotates each repetition), each side has one untimed
warm-up, and every row prints wall and CPU seconds (the worker's process for rlpipe; the
alone process or this one otherwise) and tokens per wall and per CPU second (completion
tokens). Ratios are rlpipe / alone (generation, tokens per second) and rlpipe / plain
(update), as the median of the per-repetition ratios with their min-max. Nothing here
asserts. Not measured here: the whole `rlpipe train` step (benchmarks/step_breakdown.py),
TRL (benchmarks/vs_trl.py), a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlpipe.controller.generate import generate  # noqa: E402
from rlpipe.controller.launch import build_runtime  # noqa: E402
from rlpipe.controller.persist import persist  # noqa: E402
from rlpipe.controller.preflight import engine_python  # noqa: E402
from rlpipe.controller.update import apply_committed_update  # noqa: E402
from rlpipe.controller.verify import verify_rows  # noqa: E402
from rlpipe.core.config import load_config  # noqa: E402
from rlpipe.core.seeds import derive_seed  # noqa: E402
from rlpipe.engines.sampling import encode_prompt  # noqa: E402
from rlpipe.rl.batching import TrainSample  # noqa: E402
from rlpipe.rl.pretrained import converted_gguf_folder  # noqa: E402
from rlpipe.rl.samples import train_samples  # noqa: E402
from rlpipe.workers.builders import build_policy, build_tokenizer, build_trainer  # noqa: E402


@dataclasses.dataclass
class Timed:
    wall: float
    cpu: float
    tokens: int


def process_cpu(pid: int) -> float:
    """CPU seconds (user + sys) of a process and its children so far."""
    process = psutil.Process(pid)
    total = sum(process.cpu_times()[:2])
    for child in process.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            continue
    return total


class Alone:
    """The library alone: benchmarks/stage_ceiling_alone.py in the engine's interpreter."""

    def __init__(self, python: str, engine: str, folder: str, max_model_len: int, chunked_prefill: bool) -> None:
        env = {**os.environ, "PYTHONPATH": ""}  # nothing of rlpipe
        self.process = subprocess.Popen([python, str(REPO / "benchmarks" / "stage_ceiling_alone.py"), engine, folder,
                                         "--max-model-len", str(max_model_len)] + ["--chunked-prefill"] * chunked_prefill,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def read(self) -> dict:
        for line in self.process.stdout:
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        raise RuntimeError(f"the alone process ended (exit {self.process.wait()})")

    def generate(self, request: dict) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def alone_request(tokenizer, config, tasks, seed: int, same: bool) -> dict:  # noqa: ANN001
    from rlpipe.engines.vllm import prompt_seed  # engines/vllm.py's per-prompt seeds (imports no vllm)

    rollout = config.rollout
    return {"prompts": [list(encode_prompt(tokenizer, t.prompt, config.model.prompt_format)) for t in tasks],
            "n": rollout.group_size, "temperature": rollout.temperature, "top_p": rollout.top_p,
            "max_new_tokens": rollout.max_new_tokens, "stop": list(rollout.stop), "logprobs": same,
            "seeds": [prompt_seed(seed, index) for index in range(len(tasks))] if same else None}


def generation_part(runtime, alone: dict[str, Alone], tokenizer, reps: int) -> tuple[dict[str, list[Timed]], list]:  # noqa: ANN001
    """`reps` interleaved repetitions (after one warm-up) of rlpipe's generate stage and of each
    alone process; returns the timings and the rlpipe rows of every repetition."""
    config, engine_pid = runtime.config, runtime.workers.engine.pid
    seed = derive_seed(config.seed, 1, "generate")  # the seed controller/generate.py gives step 1
    results: dict[str, list[Timed]] = {"rlpipe": [], **{side: [] for side in alone}}
    rows_of_rep, mismatches = [], 0
    for rep in range(reps + 1):  # rep 0: warm-up of every side, not counted
        tasks = runtime.mixture.sample(config.rollout.prompts_per_step, rng_seed=10_000 + rep)
        sides = list(results)
        samples: dict[str, list] = {}
        for side in sides[rep % len(sides):] + sides[:rep % len(sides)]:
            if side == "rlpipe":
                cpu, wall = process_cpu(engine_pid), time.perf_counter()
                rows = generate(runtime, 1, tasks)
                timed = Timed(time.perf_counter() - wall, process_cpu(engine_pid) - cpu, sum(len(r.completion.token_ids) for r in rows))
                samples[side] = [list(r.completion.token_ids) for r in rows]
                rows_of_rep.append(rows)
            else:
                out = alone[side].generate(alone_request(tokenizer, config, tasks, seed, same=side == "alone-same"))
                timed, samples[side] = Timed(out["wall"], out["cpu"], out["tokens"]), out["samples"]
            if rep:
                results[side].append(timed)
        if "alone-same" in samples:
            mismatches += sum(a != b for a, b in zip(samples["rlpipe"], samples["alone-same"]))
        print(f"  generation rep {rep}{' (warm-up)' if not rep else ''}: " + ", ".join(
            f"{side} {r[-1].wall:.2f} s" for side, r in results.items() if rep and r), f"load {os.getloadavg()[0]:.1f}", flush=True)
    if "alone-same" in alone:
        print(f"  seeded samples that differ between rlpipe's engine and vllm alone with its request: {mismatches} of "
              f"{(reps + 1) * config.rollout.prompts_per_step * config.rollout.group_size}")
    return results, rows_of_rep


def plain_update(model, optimizer, samples: list[TrainSample], seed: int, config, pad: int) -> None:  # noqa: ANN001
    """The plain PyTorch loop (module docstring), the Trainer's shuffle and batching."""
    train, temperature = config.train, config.rollout.temperature
    order = samples[:]
    random.Random(seed).shuffle(order)
    size, extra = divmod(len(order), train.mini_batches_per_step)
    start = 0
    model.train()
    for index in range(train.mini_batches_per_step):
        mini = order[start:start + size + (index < extra)]
        start += len(mini)
        tokens = sum(len(s.token_ids) for s in mini)
        optimizer.zero_grad(set_to_none=True)
        for first in range(0, len(mini), train.micro_batch_size):
            micro = mini[first:first + train.micro_batch_size]
            width = max(len(s.prompt_token_ids) + len(s.token_ids) for s in micro)
            ids = torch.full((len(micro), width), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            loss_mask = torch.zeros((len(micro), width - 1))
            for row, s in enumerate(micro):
                sequence = s.prompt_token_ids + s.token_ids
                ids[row, :len(sequence)], mask[row, :len(sequence)] = torch.tensor(sequence), 1
                loss_mask[row, len(s.prompt_token_ids) - 1:len(sequence) - 1] = 1
            begin = min(len(s.prompt_token_ids) for s in micro) - 1  # the first column that predicts a completion token
            logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=width - begin, use_cache=False).logits[:, :-1].float()
            logits = logits / temperature
            targets = ids[:, begin + 1:]
            logp = logits.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(logits, dim=-1)
            advantages = torch.tensor([s.advantage for s in micro])
            loss = -(advantages[:, None] * logp * loss_mask[:, begin:]).sum() / tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
        optimizer.step()
    model.eval()


def commit_rows(runtime, rows: list, step: int) -> None:  # noqa: ANN001
    """The rows as step `step`'s committed part, sampled by version step-1, advantages +-1."""
    rows = verify_rows(runtime, [dataclasses.replace(r, step=step, policy_version=step - 1) for r in rows])
    persist(runtime, step, [[dataclasses.replace(r, advantage=1.0 if r.completion.sample_idx % 2 else -1.0) for r in rows]])


def update_part(runtime, rows: list, reps: int) -> dict[str, list[Timed]]:  # noqa: ANN001
    config, trainer_pid = runtime.config, runtime.workers.trainer.pid
    model, tokenizer = build_policy(config)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.lr, weight_decay=config.train.weight_decay, fused=True)
    in_process = build_trainer(config, model)  # the same Trainer the worker builds, on the same model
    results: dict[str, list[Timed]] = {"rlpipe": [], "in-process": [], "plain": []}
    for rep in range(reps + 1):
        step = rep + 1
        commit_rows(runtime, rows, step)
        samples = train_samples(runtime.records.lake.read_parts(runtime.records.lake.read_manifest(runtime.run_id, step).parts))
        tokens = sum(len(s.token_ids) for s in samples)
        shuffle_seed = derive_seed(config.seed, step, "mini-batches")
        sides = list(results)
        for side in sides[rep % 3:] + sides[:rep % 3]:
            if side == "rlpipe":
                cpu, wall = process_cpu(trainer_pid), time.perf_counter()
                apply_committed_update(runtime, step)
                timed = Timed(time.perf_counter() - wall, process_cpu(trainer_pid) - cpu, tokens)
            else:
                cpu, wall = time.process_time(), time.perf_counter()
                if side == "plain":
                    plain_update(model, optimizer, samples, shuffle_seed, config, pad)
                else:
                    in_process.update(samples, shuffle_seed=shuffle_seed)
                timed = Timed(time.perf_counter() - wall, time.process_time() - cpu, tokens)
                _trim_heap()  # as the worker does after each reply (server.py): the freed activations back to the OS
            if rep:
                results[side].append(timed)
        print(f"  update rep {rep}{' (warm-up)' if not rep else ''}: " + ", ".join(
            f"{side} {r[-1].wall:.2f} s" for side, r in results.items() if rep and r), f"load {os.getloadavg()[0]:.1f}", flush=True)
    return results


def _trim_heap() -> None:
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def _spread(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def report(title: str, results: dict[str, list[Timed]], ours: str, bases: list[str]) -> None:
    print(f"\n{title}: median (min-max) over {len(results[ours])} reps")
    for side, runs in results.items():
        print(f"  {side:<12} wall {_spread([r.wall for r in runs])} s  cpu {_spread([r.cpu for r in runs])} s  "
              f"tokens {runs[0].tokens}  {_spread([r.tokens / r.wall for r in runs], 1)} tok/s  "
              f"{_spread([r.tokens / r.cpu for r in runs], 1)} tok/cpu-s")
    for base in bases:
        for clock in ("wall", "cpu"):
            ratios = [(a.tokens / getattr(a, clock)) / (b.tokens / getattr(b, clock)) for a, b in zip(results[ours], results[base])]
            print(f"  ratio {ours}/{base} tokens per {clock} second: {_spread(ratios)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=str(REPO / "configs" / "smollm2_math.toml"))
    parser.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--parts", default="generate,update")
    parser.add_argument("--update-prompts", type=int, default=0,
                        help="update on the samples of this many of the generated prompts (0: all, the step's batch)")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    args = parser.parse_args()
    parts = args.parts.split(",")
    with tempfile.TemporaryDirectory(prefix="rlpipe-stage-ceiling-") as scratch:
        config = load_config(args.config, [f'storage.lake_uri="{scratch}/lake"', f'tracking.mlflow_uri="sqlite:///{scratch}/mlflow.db"',
                                           f'rollout.engine="{args.engine}"', f"rollout.max_new_tokens={args.max_new_tokens}",
                                           "rollout.dynamic_sampling=false", "train.steps=1000", *args.overrides])
        # no held-out evaluation here: the eval-only settings (hf-only) are dropped for any engine
        config = config.model_copy(update={"eval": config.eval.model_copy(update={"engine_dtype": None, "batch_size": None})})
        folder = str(converted_gguf_folder(config.model.gguf)) if config.model.gguf else config.model.path
        print(f"{args.config}: engine {args.engine}, {config.rollout.prompts_per_step} prompts x {config.rollout.group_size} "
              f"samples, {args.max_new_tokens} new tokens, T {config.rollout.temperature}; micro-batch {config.train.micro_batch_size}, "
              f"{config.train.mini_batches_per_step} mini-batches; {args.reps} reps; {os.cpu_count()} CPUs, torch threads "
              f"{torch.get_num_threads()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {os.getloadavg()}", flush=True)
        # vllm: its request as rlpipe makes it (same settings), and vLLM's defaults with a text-only request
        chunked = {"alone-same": False, "alone-default": True} if args.engine == "vllm" else {"alone-default": False}
        if "generate" not in parts:  # the update part needs one generation of rlpipe's, no alone process
            chunked = {}
        python = engine_python(config)
        alone = {side: Alone(python, args.engine, folder, config.model.max_position_embeddings, flag) for side, flag in chunked.items()}
        runtime = build_runtime(f"ceiling-{os.getpid()}", config)
        try:
            started = time.perf_counter()
            for process in alone.values():
                process.read()  # ready
            gen, rows_of_rep = generation_part(runtime, alone, build_tokenizer(config), args.reps if "generate" in parts else 0)
            for process in alone.values():
                process.close()
            runtime.workers.engine.close()  # its memory back before the update part
            print(f"  (workers and alone process started and generation done in {time.perf_counter() - started:.0f} s)")
            if "generate" in parts:
                report("generation", gen, "rlpipe", list(alone))
            if "update" in parts:
                rows = rows_of_rep[0]
                kept = list(dict.fromkeys(r.task.task_id for r in rows))[:args.update_prompts or None]
                rows = [r for r in rows if r.task.task_id in kept]
                print(f"  update: {len(rows)} samples of {len(kept)} prompts, {sum(len(r.completion.token_ids) for r in rows)} "
                      "completion tokens", flush=True)
                report("update", update_part(runtime, rows, args.reps), "rlpipe", ["plain", "in-process"])
        finally:
            runtime.close()
    print(f"\nload average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
