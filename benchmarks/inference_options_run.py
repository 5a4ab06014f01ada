"""One variant of benchmarks/inference_options.py, in the interpreter its engine needs:
`PYTHON benchmarks/inference_options_run.py WORKLOAD.json VARIANT.json`.

inference_options.py starts it once per (repetition, variant). Engines (variant["engine"]):
- "hf", "vllm": built by benchmarks/engine_speed_run.py's `build` (rlpipe's HFEngine, batched;
  rlpipe's VLLMEngine). For vllm, variant["ngram"] adds vLLM's n-gram speculative decoding
  (`speculative_config={"method": "ngram", ...}`, injected into the `vllm.LLM` call that
  VLLMEngine makes; rlpipe's engine itself is unchanged) and turns vLLM's stats on, so the
  acceptance counters (vllm:spec_decode_*) can be read after each case; variant["fix_expand"]
  then replaces vLLM 0.32's CPU `expand_kernel` shim, which drops its output for float and
  int32 tensors (vllm-project/vllm#55005: the per-token temperature of the rejection sampler
  is left uninitialised memory), by a correct one, to measure what speculation would do
  once vLLM is fixed.
- "hf-generate": transformers' `model.generate`, one sequence at a time (its assisted and
  prompt-lookup decoding refuse a batch above 1 and num_return_sequences above 1), sampled
  at the workload's temperature, top_k 0, top_p 1, stop strings; variant["lookup"] sets
  `prompt_lookup_num_tokens`. Counts the model's forward calls (tokens per forward > 1 is
  what the lookup saved). Only the first variant["prompts"] prompts of a case.
- "vllm-gguf": `vllm.LLM` on the GGUF file itself; prints the error vLLM gives, if any.

Prints one JSON line per case: CPU seconds of this process (user + sys, all threads), wall
seconds, completion tokens, each completion's (task id, text, token count), and the
speculation counters (vllm) or forward calls (hf-generate); each completion also carries its
prompt's and its own token ids (the driver scores them under the float32 model). Imports no verifier: the driver
scores. It asserts nothing.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # engine_speed_run, next to this file

from engine_speed_run import _cpu_seconds, build  # noqa: E402

from rlpipe.engines.sampling import SamplingParams, encode_prompt  # noqa: E402

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def correct_cpu_expand(output, input_val, cu_num_tokens, replace_from, replace_to, max_num_tokens=None) -> None:  # noqa: ANN001
    """vLLM's expand_kernel on CPU at the caller's dtype: input_val[i] (replace_from -> replace_to)
    repeated over output[cu[i-1]:cu[i]]."""
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output.copy_(torch.repeat_interleave(values, counts, output_size=output.numel()))


def build_vllm_with_options(workload: dict, variant: dict):  # noqa: ANN201 - a VLLMEngine
    import vllm

    original = vllm.LLM
    extra = {"disable_log_stats": False}
    if variant.get("ngram"):
        extra["speculative_config"] = {"method": "ngram", "num_speculative_tokens": variant["ngram"]["tokens"],
                                       "prompt_lookup_min": variant["ngram"]["min"], "prompt_lookup_max": variant["ngram"]["max"]}
    vllm.LLM = lambda *args, **kwargs: original(*args, **{**kwargs, **extra})
    try:
        engine = build(workload, variant)
    finally:
        vllm.LLM = original
    if variant.get("fix_expand"):
        # after the worker registered vLLM's own overrides: swap the implementation inside the
        # override object every holder of the kernel points at (register_kernels a second time
        # fails on this vLLM: its rescan of sys.modules trips over a torch.ops wrapper)
        from vllm.v1.sample import rejection_sampler

        override = rejection_sampler.expand_kernel
        if not hasattr(override, "_impl"):
            raise SystemExit(f"vLLM's expand_kernel is {type(override).__name__}, not a CPU override: nothing to fix here")
        override._impl = override.func = correct_cpu_expand
        override._forward_by_name = False  # launches pass the kernel's names; ours are positional
    return engine


def spec_counters(engine) -> dict[str, float]:  # noqa: ANN001 - a VLLMEngine
    return {m.name: float(m.value) for m in engine._llm.get_metrics() if m.name in SPEC_COUNTERS}


class GenerateEngine:
    """transformers' generate, one sequence at a time, with or without prompt lookup."""

    def __init__(self, workload: dict, variant: dict) -> None:
        from rlpipe.rl.policy import load_local_model

        self.model, self.tokenizer = load_local_model(workload["model_dir"], device="cpu", dtype="float32")
        self.model.eval()
        self.prompt_format = workload["prompt_format"]
        self.lookup = variant.get("lookup")
        self.forwards = 0
        self.model.register_forward_hook(self._count)

    def _count(self, *_: object) -> None:
        self.forwards += 1

    def generate(self, prompts: list[tuple[str, str]], params: SamplingParams) -> list[tuple]:
        out = []
        for index, (task_id, prompt) in enumerate(prompts):
            ids = torch.tensor([encode_prompt(self.tokenizer, prompt, self.prompt_format)])
            for sample in range(params.n):
                torch.manual_seed(params.seed * 100_003 + index * 1000 + sample)
                with torch.no_grad():
                    generated = self.model.generate(
                        ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=params.temperature, top_k=0,
                        top_p=1.0, max_new_tokens=params.max_new_tokens, stop_strings=list(params.stop) or None,
                        tokenizer=self.tokenizer, prompt_lookup_num_tokens=self.lookup,
                        pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id)
                new = generated[0, ids.shape[1]:].tolist()
                text = self.tokenizer.decode(new, skip_special_tokens=True)
                for stop in params.stop:  # the engines' convention: the text ends before the stop string
                    text = text.split(stop, 1)[0]
                out.append((task_id, text, len(new), ids[0].tolist(), new))
        return out


def try_gguf(workload: dict) -> None:
    import vllm

    try:
        vllm.LLM(workload["gguf"], tokenizer=workload["model_dir"], dtype="float32", enforce_eager=True, max_model_len=512,
                 kv_cache_memory_bytes=2**29)
    except Exception as exc:  # noqa: BLE001 - whatever vLLM raises is the finding
        print(json.dumps({"case": "unsupported", "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}), flush=True)
        return
    print(json.dumps({"case": "unsupported", "error": None}), flush=True)


def main() -> None:
    workload = json.loads(Path(sys.argv[1]).read_text())
    variant = json.loads(Path(sys.argv[2]).read_text())
    torch.set_num_threads(variant["threads"])
    if variant["engine"] == "vllm-gguf":
        try_gguf(workload)
        return
    started = time.perf_counter()
    generate_one_by_one = variant["engine"] == "hf-generate"
    if generate_one_by_one:
        engine = GenerateEngine(workload, variant)
    elif variant["engine"] == "vllm":
        engine = build_vllm_with_options(workload, variant)
    else:
        engine = build(workload, variant)
    print(json.dumps({"case": "build", "wall": time.perf_counter() - started}), flush=True)
    first = workload["cases"][0]
    engine.generate([tuple(p) for p in first["prompts"][:2]], SamplingParams(**{**first["params"], "n": 2, "stop": tuple(first["params"]["stop"])}))
    for case in workload["cases"]:
        params = SamplingParams(**{**case["params"], "stop": tuple(case["params"]["stop"])})
        prompts = [tuple(prompt) for prompt in case["prompts"]]
        if generate_one_by_one:
            prompts = prompts[:variant["prompts"]]
        counters = spec_counters(engine) if variant["engine"] == "vllm" else {}
        forwards = engine.forwards if generate_one_by_one else 0
        wall, cpu = time.perf_counter(), _cpu_seconds()
        completions = engine.generate(prompts, params)
        cpu, wall = _cpu_seconds() - cpu, time.perf_counter() - wall
        if not generate_one_by_one:
            completions = [(c.task_id, c.text, len(c.token_ids), list(c.prompt_token_ids), list(c.token_ids)) for c in completions]
        extra = {}
        if variant["engine"] == "vllm":
            after = spec_counters(engine)
            extra["spec"] = {name.rsplit("_num_", 1)[1]: after[name] - counters.get(name, 0.0) for name in after}
        if generate_one_by_one:
            extra["forwards"] = engine.forwards - forwards
        print(json.dumps({"case": case["name"], "cpu": cpu, "wall": wall, "tokens": sum(c[2] for c in completions),
                          "completions": [list(c) for c in completions], **extra}), flush=True)


if __name__ == "__main__":
    main()
