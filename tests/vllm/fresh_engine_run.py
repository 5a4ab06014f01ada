"""Run the reference calls on a VLLMEngine started fresh on a folder; print them as JSON.

`python -m tests.vllm.fresh_engine_run FOLDER`: used by test_vllm_engine.py to compare an
engine that loaded new weights in place with one started on those weights (vLLM holds one
engine per process, so the fresh one needs its own process).
"""

from __future__ import annotations

import json
import sys

from rlpipe.engines.sampling import SamplingParams

PROMPTS = [("add", "12+35="), ("word", "reverse: abc"), ("short", "x")]
REFERENCE_CALLS = (
    SamplingParams(n=3, temperature=1.0, max_new_tokens=12, seed=5),
    SamplingParams(n=1, max_new_tokens=12, greedy=True),
)


def reference_outputs(engine) -> list[dict]:
    """token ids, logprobs, text and finish reason of every completion of REFERENCE_CALLS."""
    return [
        {"token_ids": list(c.token_ids), "logprobs": list(c.logprobs), "text": c.text, "finish_reason": c.finish_reason}
        for params in REFERENCE_CALLS for c in engine.generate(PROMPTS, params)
    ]


def main(folder: str) -> None:
    from rlpipe.engines.vllm import VLLMEngine
    from rlpipe.rl.policy import load_local_tokenizer
    from tests.vllm.conftest import KV_CACHE_GIB, MAX_MODEL_LEN

    engine = VLLMEngine(folder, tokenizer=load_local_tokenizer(folder), max_model_len=MAX_MODEL_LEN, kv_cache_gib=KV_CACHE_GIB)
    print("RESULT " + json.dumps(reference_outputs(engine)))


if __name__ == "__main__":
    main(sys.argv[1])
