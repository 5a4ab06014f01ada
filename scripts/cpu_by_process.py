"""CPU seconds of every process on the machine while a command runs, summed by kind of process
(pytest workers, Prefect servers, `rlpipe` commands, workers, docker, bubblewrap, ...): where the
test suite's CPU goes, so that CI time is cut where it is spent.

    python scripts/cpu_by_process.py -- make pytest
    python scripts/cpu_by_process.py --json out.json -- .venv/bin/pytest -q tests/cli

It reads /proc every `--interval` seconds and adds each process's user + system time since the
last sample to its kind (`kind_of`). A process that starts and ends between two samples is not
seen, and one that ends loses its last interval: the kinds' sum is below the machine's total,
which is printed beside it (from /proc/stat). Processes of positive niceness (other people's
jobs under `nice`) are one kind of their own. Docker containers' processes are counted as
what they run (their kind is by command line). Linux only; does not start or change anything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")

KINDS = (  # (kind, substrings of the command line, any of which marks it), first match wins
    ("prefect server", ("prefect.server", "uvicorn")),
    ("rlpipe worker zygote", ("rlpipe.workers.zygote",)),
    ("tests' CLI zygote (forked rlpipe commands)", ("cli_zygote",)),
    ("rlpipe command", ("rlpipe.cli.main", "bin/rlpipe ")),
    ("pytest process (in-process tests)", ("exec(eval(sys.stdin", "pytest")),  # xdist workers: execnet's -c
    ("moto S3 server", ("moto",)),
    ("mlflow", ("mlflow",)),
    ("torchrun", ("torchrun", "torch.distributed")),
    ("bubblewrap sandbox", ("bwrap",)),
    ("docker engine", ("dockerd", "containerd", "runc")),
)


def kind_of(comm: str, cmdline: str, nice: int) -> str:
    """The kind a process counts under: its niceness, its name (workers rename themselves
    `rlpipe-trainer`, `rlpipe-engine`), else the first of KINDS its command line matches."""
    if nice > 0:
        return "niced (other jobs)"
    if comm.startswith("rlpipe-"):
        return f"rlpipe worker ({comm})"
    for kind, marks in KINDS:
        if any(mark in cmdline for mark in marks):
            return kind
    return f"other ({comm})"


def _stat(pid: str) -> tuple[str, float, int, str] | None:
    """(start time, CPU seconds, niceness, name) of a process; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return fields[19], (int(fields[11]) + int(fields[12])) / TICKS_PER_S, int(fields[16]), name


def machine_cpu_s() -> float:
    """CPU seconds the whole machine spent busy since boot (/proc/stat: all but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / TICKS_PER_S


class Sampler:
    """Adds each process's CPU time since the previous sample to its kind."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], float] = {}
        self.kinds: dict[str, float] = {}
        self.sample(count=False)

    def sample(self, count: bool = True) -> None:
        now: dict[tuple[str, str], float] = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            stat = _stat(pid)
            if stat is None:
                continue
            started, cpu_s, nice, name = stat
            now[(pid, started)] = cpu_s
            spent = cpu_s - self.seen.get((pid, started), 0.0)
            if count and spent > 0:
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    cmdline = ""
                kind = kind_of(name, cmdline, nice)
                self.kinds[kind] = self.kinds.get(kind, 0.0) + spent
        self.seen = now


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples of /proc")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: cpu_by_process.py -- COMMAND ...")
    sampler, machine_before, started = Sampler(), machine_cpu_s(), time.monotonic()
    done = threading.Event()

    def keep_sampling() -> None:
        while not done.wait(args.interval):
            sampler.sample()

    thread = threading.Thread(target=keep_sampling, daemon=True)
    thread.start()
    returncode = subprocess.call(command)
    done.set()
    thread.join()
    sampler.sample()
    wall_s, machine_s = time.monotonic() - started, machine_cpu_s() - machine_before
    print(f"\ncpu_by_process: {' '.join(command)} exited {returncode} after {wall_s:.0f} s wall;"
          f" the machine was busy {machine_s:.0f} CPU s ({machine_s / wall_s:.2f} cores), the kinds below"
          f" sum to {sum(sampler.kinds.values()):.0f} (processes shorter than a sample are missed)")
    for kind, seconds in sorted(sampler.kinds.items(), key=lambda item: -item[1]):
        if seconds >= 0.5:
            print(f"{seconds:9.1f}  {kind}")
    if args.json:
        args.json.write_text(json.dumps({"command": command, "returncode": returncode, "wall_s": wall_s,
                                         "machine_cpu_s": machine_s, "kinds": sampler.kinds}, indent=1))
    return returncode


if __name__ == "__main__":
    sys.exit(main())
