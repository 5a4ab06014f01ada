"""The engine library alone, for benchmarks/stage_ceiling.py: `PYTHON benchmarks/stage_ceiling_alone.py
ENGINE MODEL_DIR [--dtype float32] [--max-model-len 128]`, started by stage_ceiling.py under the
interpreter the engine needs (vllm: .venv-vllm/bin/python; hf: the main venv's).

It loads the model folder once with the library's own API, then serves generate requests, one
JSON object per stdin line: {"prompts": [[token ids], ...], "n", "temperature", "top_p",
"max_new_tokens", "stop": [...], "seeds": [per prompt] | null, "logprobs": bool}. For each it
prints one line `RESULT {json}` on stdout (vLLM prints there too): wall and CPU seconds of the
generate call alone (this process, all threads; no IPC, no encoding), the completion tokens,
and the token ids of every sample (prompt order, then sample order), so the driver can check
that a seeded request sampled what rlpipe's engine sampled.

- vllm: `vllm.LLM(...).generate` on the prompts' token ids with vllm.SamplingParams; the LLM is
  built with the settings engines/vllm.py gives it (eager, prefix caching, a KV cache of 0.5 GiB
  instead of 1, which holds SmolLM2-135M's 64 x 128 tokens (0.38 GB), for less memory on a shared machine;
  processed logprobs, the engine core in this process, chunked prefill off on CPU), so that
  the engine, not a setting, is what is compared; `--chunked-prefill` turns vLLM's default
  chunked prefill back on (then seeded requests fail on CPU: engines/vllm.py says why).
  `seeds` null and `logprobs` false: the request a user who only wants the text would send.
- hf: transformers' `model.generate` on the left-padded prompts, do_sample at the temperature,
  top_k off, num_return_sequences n, stop_strings, the model's EOS; every row stays in the batch
  until the last finishes (HF's own loop). Tokens counted up to each row's EOS or stop.

It imports nothing of rlpipe: this is the library without rlpipe around it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class VllmAlone:
    def __init__(self, folder: str, dtype: str, max_model_len: int, chunked_prefill: bool) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # as engines/vllm.py: the engine core in-process
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        import vllm

        self.vllm = vllm
        self.llm = vllm.LLM(folder, dtype=dtype, seed=0, max_model_len=max_model_len, enable_prefix_caching=True,
                            enforce_eager=True, logprobs_mode="processed_logprobs", max_num_seqs=256,
                            kv_cache_memory_bytes=2**29, enable_chunked_prefill=chunked_prefill)

    def generate(self, request: dict) -> list:
        seeds = request["seeds"] or [None] * len(request["prompts"])
        sampling = [self.vllm.SamplingParams(n=request["n"], temperature=request["temperature"], top_p=request["top_p"],
                                             max_tokens=request["max_new_tokens"], stop=request["stop"], seed=seed,
                                             logprobs=0 if request["logprobs"] else None, skip_special_tokens=True)
                    for seed in seeds]
        return self.llm.generate([{"prompt_token_ids": ids} for ids in request["prompts"]], sampling, use_tqdm=False)

    def samples(self, outputs: list, request: dict) -> list[list[int]]:
        return [list(sample.token_ids) for output in outputs for sample in sorted(output.outputs, key=lambda s: s.index)]


class HfAlone:
    def __init__(self, folder: str, dtype: str, max_model_len: int, chunked_prefill: bool) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=getattr(torch, dtype)).eval()
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id

    def generate(self, request: dict):  # noqa: ANN201 - a tensor
        torch = self.torch
        prompts = request["prompts"]
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=request["temperature"],
                                      top_p=request["top_p"], top_k=0, max_new_tokens=request["max_new_tokens"],
                                      num_return_sequences=request["n"], stop_strings=request["stop"] or None,
                                      tokenizer=self.tokenizer, pad_token_id=self.pad)
        return out[:, width:]

    def samples(self, out, request: dict) -> list[list[int]]:  # noqa: ANN001 - a tensor
        rows = []
        for row in out.tolist():
            tokens: list[int] = []
            for token in row:
                tokens.append(token)
                if token == self.model.generation_config.eos_token_id or any(s in self.tokenizer.decode(tokens[-4:]) for s in request["stop"]):
                    break
            rows.append(tokens)
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=("vllm", "hf"))
    parser.add_argument("model_dir")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-model-len", type=int, default=128)
    parser.add_argument("--chunked-prefill", action="store_true", help="vllm: its default chunked prefill (no seeded requests on CPU)")
    args = parser.parse_args()
    alone = (VllmAlone if args.engine == "vllm" else HfAlone)(args.model_dir, args.dtype, args.max_model_len, args.chunked_prefill)
    print("RESULT " + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        wall, cpu = time.perf_counter(), _cpu_seconds()
        raw = alone.generate(request)
        cpu, wall = _cpu_seconds() - cpu, time.perf_counter() - wall
        samples = alone.samples(raw, request)
        print("RESULT " + json.dumps({"wall": wall, "cpu": cpu, "tokens": sum(map(len, samples)), "samples": samples}), flush=True)


if __name__ == "__main__":
    main()
