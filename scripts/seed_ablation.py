"""Seed ablation: the quickstart's learning run without the pipeline, to find what a seed needs.

    .venv/bin/python scripts/seed_ablation.py --seed 1 [--threads 2] [--set rollout.group_size=16 ...]
        [--eval-every 20] [--warm-cache /tmp/warm]

What it does: the same computation as `rlpipe train configs/quickstart.toml --set seed=S`
(the same config, parts and seeds, step by step: controller/runtime.py's builders, the warm-start
of tasks/lifecycle.py stopped at the target accuracy, then per RL step the tasks of
(seed, step), the engine's samples, the verifier, group advantages, Trainer.update with the
step's shuffle seed, the weight sync), then greedy held-out accuracy before and after. It
prints per step the reward and the share of groups with no signal (all samples right or all
wrong), per eval the held-out accuracy per word length, and a final `RESULT {json}` line.

What it does not: Prefect, the lake, MLflow, checkpoints, resume (the flow adds those per
step; they do not change the numbers). `--warm-cache DIR` keeps the warm-started weights per
(seed, threads, model and warm-start settings), so ablations of the RL recipe skip the
warm-start; a warm-start setting in `--set` makes another cache entry.

Findings (the warm start's accuracy on 5-letter words decides a seed's gain; ablations of
the RL recipe): docs/RESULTS.md, "The seed ablation".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlpipe.controller.sample import build_mixture, build_policy, build_trainer, step_tasks  # noqa: E402
from rlpipe.core.config import RunConfig, load_config  # noqa: E402
from rlpipe.core.records import Task  # noqa: E402
from rlpipe.core.seeds import derive_seed  # noqa: E402
from rlpipe.engines.hf import HFEngine  # noqa: E402
from rlpipe.engines.sampling import SamplingParams  # noqa: E402
from rlpipe.envs.mixture import Mixture  # noqa: E402
from rlpipe.rl.advantages import group_advantages  # noqa: E402
from rlpipe.rl.batching import TrainSample  # noqa: E402
from rlpipe.rl.warmstart import warm_start  # noqa: E402

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.toml"


@dataclass(frozen=True)
class AblationResult:
    seed: int
    threads: int
    overrides: list[str]
    before: float
    after: float
    gain_points: float
    best: float
    steps: int
    warm_start_s: float
    rl_s: float


def heldout_accuracy(engine: HFEngine, mixture: Mixture, config: RunConfig, tasks: list[Task]) -> tuple[float, dict[int, float]]:
    """Greedy pass@1 as controller/evaluation.py greedy_accuracy computes it, and per word length."""
    params = SamplingParams(n=1, temperature=1.0, top_p=1.0, max_new_tokens=config.rollout.max_new_tokens,
                            stop=config.rollout.stop, seed=0, greedy=True)
    completions = engine.generate([(t.task_id, t.prompt) for t in tasks], params)
    by_length: dict[int, list[bool]] = defaultdict(list)
    for task, completion in zip(tasks, completions):
        passed = bool(mixture.envs[task.domain].verify(task, completion.text).passed)
        by_length[len(task.reference_answer or "")].append(passed)
    total = sum(sum(v) for v in by_length.values()) / len(tasks)
    return total, {length: round(sum(v) / len(v), 3) for length, v in sorted(by_length.items())}


def warm_started(config: RunConfig, threads: int, cache: Path | None) -> tuple[torch.nn.Module, object, Mixture, float]:
    """The policy after the flow's warm-start (tasks/lifecycle.py), from the cache if there."""
    torch.manual_seed(config.seed)
    policy, tokenizer = build_policy(config)
    mixture = build_mixture(config)
    key = json.dumps([config.seed, threads, config.model.model_dump(mode="json"), config.warmstart.model_dump(mode="json"),
                      config.envs.model_dump(mode="json")], sort_keys=True)
    path = cache / f"warm-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt" if cache else None
    if path is not None and path.exists():
        policy.load_state_dict(torch.load(path, weights_only=True))
        return policy, tokenizer, mixture, 0.0
    started = time.perf_counter()
    tasks = mixture.sample(config.envs.train_size, rng_seed=derive_seed(config.seed, 0, "warmstart"))
    check_tasks = mixture.sample(config.warmstart.check_tasks, rng_seed=derive_seed(config.seed, 0, "warmstart-check"))
    check_engine = HFEngine(policy, tokenizer, batch_size=config.rollout.batch_size)

    def stop_check(steps_done: int) -> bool:
        check_engine.load_weights(((n, p.detach()) for n, p in policy.named_parameters()), 0)
        accuracy, _ = heldout_accuracy(check_engine, mixture, config, check_tasks)
        print(f"warm-start step {steps_done}: training accuracy {accuracy:.3f}", flush=True)
        return config.warmstart.target_accuracy is not None and accuracy >= config.warmstart.target_accuracy

    warm_start(policy, tokenizer, [(t.prompt, t.reference_answer) for t in tasks if t.reference_answer is not None],
               steps=config.warmstart.steps, batch_size=config.warmstart.batch_size, lr=config.warmstart.lr,
               seed=derive_seed(config.seed, 0, "warmstart-order"), check_every=config.warmstart.check_every_steps,
               stop_check=stop_check if config.warmstart.target_accuracy is not None else None)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(policy.state_dict(), path)
    return policy, tokenizer, mixture, time.perf_counter() - started


def run(seed: int, threads: int, overrides: list[str], eval_every: int, cache: Path | None) -> AblationResult:
    config = load_config(QUICKSTART, [f"seed={seed}", *overrides])
    policy, tokenizer, mixture, warm_seconds = warm_started(config, threads, cache)
    trainer = build_trainer(config, policy)  # after the warm-start: a fresh optimizer, as in the flow
    trainer.reset_reference()
    engine = HFEngine(policy, tokenizer, batch_size=config.rollout.batch_size)
    heldout = mixture.heldout(config.envs.heldout_size, seed=config.seed)
    before, per_length = heldout_accuracy(engine, mixture, config, heldout)
    print(f"seed {seed}: held-out before RL {before:.3f} by word length {per_length}", flush=True)
    rollout, runtime, best, started = config.rollout, SimpleNamespace(config=config, mixture=mixture), before, time.perf_counter()
    for step in range(1, config.train.steps + 1):
        tasks = step_tasks(runtime, step)
        params = SamplingParams(n=rollout.group_size, temperature=rollout.temperature, top_p=rollout.top_p,
                                max_new_tokens=rollout.max_new_tokens, stop=rollout.stop,
                                seed=derive_seed(seed, step, "generate"))
        completions = engine.generate([(t.task_id, t.prompt) for t in tasks], params)
        by_id = {t.task_id: t for t in tasks}
        groups: dict[str, list[tuple[object, float]]] = defaultdict(list)
        for completion in completions:
            task = by_id[completion.task_id]
            groups[task.task_id].append((completion, mixture.envs[task.domain].verify(task, completion.text).reward))
        samples, rewards, flat = [], [], 0
        for task_id in sorted(groups):
            group = sorted(groups[task_id], key=lambda pair: pair[0].sample_idx)
            values = [reward for _, reward in group]
            rewards += values
            flat += len(set(values)) == 1
            for (completion, _), advantage in zip(group, group_advantages(values, config.algo.advantage)):
                samples.append(TrainSample(completion.prompt_token_ids, completion.token_ids, completion.logprobs, advantage))
        metrics = trainer.update(samples, shuffle_seed=derive_seed(seed, step, "mini-batches"))
        engine.load_weights(trainer.named_weights(), step)
        line = (f"step {step:3d} reward {sum(rewards) / len(rewards):.3f} groups without signal {flat / len(groups):.2f} "
                f"clip {metrics.clip_frac:.3f} grad_norm {metrics.grad_norm:.2f}")
        if eval_every and step % eval_every == 0 and step != config.train.steps:
            accuracy, per_length = heldout_accuracy(engine, mixture, config, heldout)
            best = max(best, accuracy)
            line += f" | held-out {accuracy:.3f} {per_length}"
        print(line, flush=True)
    rl_seconds = time.perf_counter() - started
    after, per_length = heldout_accuracy(engine, mixture, config, heldout)
    print(f"seed {seed}: held-out after RL {after:.3f} by word length {per_length}", flush=True)
    return AblationResult(seed, threads, overrides, round(before, 3), round(after, 3), round(100 * (after - before), 1),
                          round(max(best, after), 3), config.train.steps, round(warm_seconds, 1), round(rl_seconds, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (another count: another warm start)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override a.b=c (repeatable)")
    parser.add_argument("--eval-every", type=int, default=0, help="held-out evaluation every N RL steps (0: before/after only)")
    parser.add_argument("--warm-cache", type=Path, default=None, help="folder for warm-started weights, reused across runs")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = run(args.seed, args.threads, args.overrides, args.eval_every, args.warm_cache)
    print("RESULT " + json.dumps(asdict(result)), flush=True)


if __name__ == "__main__":
    main()
