"""Difficulty: pass@k of a policy on each task, and the histogram of per-task pass rates.

What it does: `measure_difficulty(policy, tasks, verify_many, ...)` loads a policy folder
saved by rlpipe (an HF model folder: config, safetensors, tokenizer; e.g. a checkpoint's
`policy/`), samples `samples` completions per task with the hf engine in this process,
verifies them, and returns per-task pass@1 and pass@k (the unbiased estimator of Chen et
al. 2021: 1 - C(n-c, k) / C(n, k)). torch, transformers and the engine are imported inside
the function, so importing this module stays light (the controller imports qa).

What it does not: gate (difficulty is information, not a pass/fail), use a worker process
or a GPU pool, or load LoRA adapters apart from their merged policy folder.
"""

from __future__ import annotations

from math import comb

from rlpipe.core.records import Task
from rlpipe.qa.checks import VerifyMany
from rlpipe.qa.records import Difficulty, TaskDifficulty

BINS = ((0.0, 0.0, "0%"), (0.0, 0.25, "(0, 25%]"), (0.25, 0.5, "(25, 50%]"), (0.5, 0.75, "(50, 75%]"),
        (0.75, 1.0, "(75, 100%)"), (1.0, 1.0, "100%"))


def pass_at_k(samples: int, correct: int, k: int) -> float:
    """Unbiased pass@k from `samples` draws of which `correct` passed (k <= samples)."""
    if not 1 <= k <= samples or not 0 <= correct <= samples:
        raise ValueError(f"need 1 <= k <= samples and 0 <= correct <= samples, got k={k}, samples={samples}, correct={correct}")
    if samples - correct < k:
        return 1.0
    return 1.0 - comb(samples - correct, k) / comb(samples, k)


def histogram(pass_rates: list[float]) -> tuple[tuple[str, int], ...]:
    """How many tasks fall in each pass@1 bin of BINS (0% and 100% are bins of their own)."""
    counts = []
    for low, high, label in BINS:
        if low == high:
            counts.append((label, sum(1 for rate in pass_rates if rate == low)))
        else:
            counts.append((label, sum(1 for rate in pass_rates if low < rate <= high and rate != 1.0)))
    return tuple(counts)


def measure_difficulty(policy: str, tasks: list[Task], verify_many: VerifyMany, *, k: int, samples: int,
                       max_new_tokens: int, temperature: float, prompt_format: str, seed: int = 0,
                       stop: tuple[str, ...] = ("\n",)) -> Difficulty:
    """Sample `samples` completions per task from the policy folder and measure pass@1/pass@k."""
    if not 1 <= k <= samples:
        raise ValueError(f"need 1 <= k <= samples, got k={k}, samples={samples}")
    from rlpipe.engines.hf import HFEngine
    from rlpipe.engines.sampling import SamplingParams
    from rlpipe.rl.policy import load_local_model

    model, tokenizer = load_local_model(policy)
    engine = HFEngine(model, tokenizer, batch_size=64, prompt_format=prompt_format)  # type: ignore[arg-type]
    params = SamplingParams(n=samples, temperature=temperature, max_new_tokens=max_new_tokens, stop=stop, seed=seed)
    completions = engine.generate([(task.task_id, task.prompt) for task in tasks], params)
    by_id = {task.task_id: task for task in tasks}
    verdicts = verify_many([(by_id[completion.task_id], completion.text) for completion in completions])
    correct: dict[str, int] = {task.task_id: 0 for task in tasks}
    for completion, verdict in zip(completions, verdicts):
        correct[completion.task_id] += int(verdict.passed)
    rows = tuple(TaskDifficulty(task_id=task.task_id, split=dict(task.metadata).get("split", ""), samples=samples,
                                correct=correct[task.task_id], pass_at_1=correct[task.task_id] / samples,
                                pass_at_k=pass_at_k(samples, correct[task.task_id], k)) for task in tasks)
    return Difficulty(policy=policy, k=k, tasks=rows, histogram=histogram([row.pass_at_1 for row in rows]))
