"""Where one held-out evaluation's time goes, and what a rollout generation costs beside it:
`python benchmarks/eval_cost.py [CONFIG] [--problems N] [--reps R] [--threads T] [--set KEY=VALUE ...]`.

In one process, the engine the engine worker builds for CONFIG (default
configs/smollm2.toml; workers/engine_worker.build_engine: the GGUF's converted folder, the
hf engine, rollout.batch_size, model.prompt_format), and the request a held-out evaluation
sends it (controller/evaluation.greedy_accuracy: the run's held-out set, greedy, n = 1,
rollout.max_new_tokens, rollout.stop). Per repetition, interleaved so that load drift hits
both alike:
- eval-before / eval-after: that request with the engine's common-prefix prefill off / on
  (`HFEngine(common_prefix_sharing=...)`; each distinct prompt once and finished rows dropped
  in both); the texts of both must be the same, and the table says whether they were;
- rollout: one RL step's generation (rollout.prompts_per_step prompts x rollout.group_size
  samples at rollout.temperature, common prefix on), the unit an evaluation is compared with.

Printed per case (median of R, min-max): process CPU seconds (user + sys: the engine worker's
own work, less sensitive to a loaded machine than the wall), wall seconds, and the CPU seconds
of the prefill forward passes, the decode forward passes and the rest (sampling, stop strings,
detokenization), with the tokens each forward pass ran; then the strict accuracy (the domain's
verifier on each reply) and the ratio eval-after CPU / rollout CPU. `--threads 1` (the default)
measures work; `--threads 2` is what a run uses. Nothing here asserts: numbers are for reading.

What it does not: run the workers, Prefect, the lake or the trainer (the RL step's update and
weight sync are measured by benchmarks/long_run.py and step_breakdown.py), or score format-free.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlpipe.controller.evaluation import heldout_tasks  # noqa: E402
from rlpipe.controller.sample import build_mixture  # noqa: E402
from rlpipe.core.config import load_config  # noqa: E402
from rlpipe.engines.sampling import SamplingParams  # noqa: E402
from rlpipe.workers.engine_worker import build_engine  # noqa: E402


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class ForwardClock:
    """Wraps the engine's forward pass: CPU seconds and tokens of prefill (more than one
    position) and decode (one position) passes."""

    def __init__(self, engine) -> None:  # noqa: ANN001 - an HFEngine
        self.totals: dict[str, list[float]] = {}
        forward = engine._forward

        def timed(input_ids, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            kind = "prefill" if input_ids.shape[1] > 1 else "decode"
            started = _cpu_seconds()
            output = forward(input_ids, *args, **kwargs)
            seconds, tokens = self.totals.setdefault(kind, [0.0, 0])
            self.totals[kind] = [seconds + _cpu_seconds() - started, tokens + input_ids.numel()]
            return output

        engine._forward = timed


def run_case(engine, clock: ForwardClock, prompts, params, common: bool) -> dict:  # noqa: ANN001
    engine._common_prefix_sharing = common
    clock.totals.clear()
    wall, cpu = time.perf_counter(), _cpu_seconds()
    completions = engine.generate(prompts, params)
    cpu, wall = _cpu_seconds() - cpu, time.perf_counter() - wall
    prefill, decode = clock.totals.get("prefill", [0.0, 0]), clock.totals.get("decode", [0.0, 0])
    return {"cpu": cpu, "wall": wall, "prefill_cpu": prefill[0], "prefill_tokens": prefill[1], "decode_cpu": decode[0],
            "decode_tokens": decode[1], "rest_cpu": cpu - prefill[0] - decode[0], "completions": completions}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", default=str(REPO / "configs" / "smollm2.toml"))
    parser.add_argument("--problems", type=int, default=None, help="held-out problems (default: all of envs.heldout_size)")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config, args.overrides)
    if config.rollout.engine != "hf":
        raise SystemExit(f"eval_cost.py measures the hf engine; {args.config} has rollout.engine={config.rollout.engine!r}")
    mixture = build_mixture(config)
    tasks = heldout_tasks(config, mixture)[: args.problems]
    with tempfile.TemporaryDirectory() as scratch:
        engine = build_engine(config, scratch)
    clock = ForwardClock(engine)
    rollout = config.rollout
    greedy = SamplingParams(n=1, max_new_tokens=rollout.max_new_tokens, stop=rollout.stop, seed=0, greedy=True)
    sampled = SamplingParams(n=rollout.group_size, temperature=rollout.temperature, max_new_tokens=rollout.max_new_tokens,
                             stop=rollout.stop, seed=1)
    eval_prompts = [(task.task_id, task.prompt) for task in tasks]
    step_prompts = [(task.task_id, task.prompt) for task in mixture.sample(rollout.prompts_per_step, rng_seed=config.seed * 1000 + 1)]
    engine.generate(eval_prompts[:4], greedy)  # warm-up: first-call allocations
    results: dict[str, list[dict]] = {"eval-before": [], "eval-after": [], "rollout": []}
    for rep in range(args.reps):
        results["eval-before"].append(run_case(engine, clock, eval_prompts, greedy, common=False))
        results["eval-after"].append(run_case(engine, clock, eval_prompts, greedy, common=True))
        results["rollout"].append(run_case(engine, clock, step_prompts, sampled, common=True))
        print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
    by_id = {task.task_id: task for task in tasks}
    print(f"{len(tasks)} held-out problems, batch_size {rollout.batch_size}, {args.threads} thread(s); "
          f"rollout: {len(step_prompts)} prompts x {rollout.group_size}")
    print(f"{'case':12} {'cpu s':>20} {'wall s':>20} {'prefill cpu':>20} {'decode cpu':>20} {'rest cpu':>20}  tokens prefill/decode")
    for case, runs in results.items():
        print(f"{case:12} {_spread([r['cpu'] for r in runs])} {_spread([r['wall'] for r in runs])} "
              f"{_spread([r['prefill_cpu'] for r in runs])} {_spread([r['decode_cpu'] for r in runs])} "
              f"{_spread([r['rest_cpu'] for r in runs])}  {runs[0]['prefill_tokens']}/{runs[0]['decode_tokens']}")
    texts = {case: [[c.text for c in r["completions"]] for r in results[case]] for case in ("eval-before", "eval-after")}
    same = all(text == texts["eval-before"][0] for runs in texts.values() for text in runs)
    digest = hashlib.sha256(json.dumps(texts["eval-after"][0]).encode()).hexdigest()[:12]
    completions = results["eval-after"][0]["completions"]
    strict = sum(mixture.env_for(by_id[c.task_id]).verify(by_id[c.task_id], c.text).passed for c in completions) / len(completions)
    print(f"eval texts identical before/after: {same} (digest {digest}); strict accuracy {strict:.3f}")
    ratio = statistics.median(r["cpu"] for r in results["eval-after"]) / statistics.median(r["cpu"] for r in results["rollout"])
    print(f"eval-after CPU / rollout CPU: {ratio:.2f}")


if __name__ == "__main__":
    main()
