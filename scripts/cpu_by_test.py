"""CPU seconds of every test and test file in a `pytest -n N` run, the work of its whole
process tree included (CLI commands, workers forked from the session's zygotes, Prefect
servers, torchrun ranks): where the suite's CPU goes, test by test, so that CI time is cut
where it is spent (scripts/cpu_by_process.py sums the same by kind of process instead).

    .venv/bin/python -m pytest -p scripts.cpu_by_test -n 4 --dist loadfile --no-loadscope-reorder -q
    .venv/bin/python scripts/cpu_by_test.py [--top 40]        # the tables, from the last run

As a pytest plugin (`-p scripts.cpu_by_test`, from the repository root) each xdist worker
moves itself, at start-up, into a cgroup of its own (cgroup v1's cpuacct, or v2's cpu.stat),
so every process it starts later is counted in it, and records the cgroup's CPU time at the
start and end of each test in RESULTS_DIR/<worker>.jsonl. A test's figure is its tree's CPU
between the two, so a server that idles during a test (the worker's Prefect harness) is
counted against that test. Not counted: docker containers (the docker engine's cgroups),
anything the pytest controller process does, and a worker's imports and collection before
its cgroup exists. Without xdist (no `-n`) it records nothing. Needs root (it makes cgroups);
Linux only; asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
from pathlib import Path

RESULTS_DIR = Path(os.environ.get("RLPIPE_CPU_BY_TEST_DIR", "/tmp/rlpipe-cpu-by-test"))
V1_ROOT = Path("/sys/fs/cgroup/cpuacct")
V2_ROOT = Path("/sys/fs/cgroup")

_log = None
_usage_file: Path | None = None


def _cpu_s() -> float:
    text = _usage_file.read_text()
    if _usage_file.name == "cpuacct.usage":
        return int(text) / 1e9
    fields = dict(line.split() for line in text.splitlines())
    return int(fields["usage_usec"]) / 1e6


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest's Config
    """In an xdist worker: its own cgroup and its log file. In the controller of a run that
    starts workers (it starts before them): the last run's logs and emptied cgroups removed;
    a run without workers records nothing and so leaves the last run's logs alone."""
    global _log, _usage_file
    root = V1_ROOT if (V1_ROOT / "cpuacct.usage").exists() else V2_ROOT
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        if not getattr(config.option, "numprocesses", None):
            return  # no xdist workers (no -n, or -n 0): nothing to record, nothing to clear
        for old in RESULTS_DIR.glob("*.jsonl"):
            old.unlink()
        for old in root.glob("rlpipe-cpu-by-test-*"):
            try:
                old.rmdir()  # a cgroup goes with rmdir once no process is left in it
            except OSError:
                pass
        return
    group = root / f"rlpipe-cpu-by-test-{worker}-{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    _usage_file = group / ("cpuacct.usage" if root == V1_ROOT else "cpu.stat")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    _log = open(RESULTS_DIR / f"{worker}.jsonl", "w")  # noqa: SIM115 - open for the worker's life


def _record(nodeid: str, event: str) -> None:
    if _log is not None:
        _log.write(json.dumps({"test": nodeid, "event": event, "wall": time.time(), "cpu": _cpu_s()}) + "\n")
        _log.flush()


def pytest_runtest_logstart(nodeid: str, location) -> None:  # noqa: ANN001
    _record(nodeid, "start")


def pytest_runtest_logfinish(nodeid: str, location) -> None:  # noqa: ANN001
    _record(nodeid, "end")


def tables(folder: Path) -> tuple[dict[str, tuple[float, float]], dict[str, tuple[float, float]]]:
    """{test: (CPU s, wall s)} and {file: (CPU s, wall s)} from the workers' logs."""
    tests: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for log in sorted(folder.glob("*.jsonl")):
        started = {}
        for line in log.read_text().splitlines():
            record = json.loads(line)
            if record["event"] == "start":
                started[record["test"]] = record
                continue
            first = started.pop(record["test"])
            cpu, wall = record["cpu"] - first["cpu"], record["wall"] - first["wall"]
            for table, key in ((tests, record["test"]), (files, record["test"].split("::")[0])):
                table[key][0] += cpu
                table[key][1] += wall
    return ({key: tuple(value) for key, value in tests.items()}, {key: tuple(value) for key, value in files.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=RESULTS_DIR)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    tests, files = tables(args.folder)
    if not files:
        raise SystemExit(f"no records in {args.folder}: run pytest with `-p scripts.cpu_by_test` first")
    print(f"{len(tests)} tests, {sum(cpu for cpu, _ in files.values()):.0f} CPU s in the workers' trees")
    for title, table in (("files", files), ("tests", tests)):
        print(f"\n{'CPU s':>7} {'wall s':>7}  {title}, most CPU first")
        for key, (cpu, wall) in sorted(table.items(), key=lambda item: -item[1][0])[:args.top]:
            print(f"{cpu:7.1f} {wall:7.1f}  {key}")


if __name__ == "__main__":
    main()
