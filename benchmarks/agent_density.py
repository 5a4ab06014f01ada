"""Agent density: N concurrent trials of a scripted agent on bubblewrap, every verdict recorded.

    nice -n 19 .venv/bin/python benchmarks/agent_density.py [--trials 200] [--idle-s 8]

Each trial is a tiny Harbor-format task (write `ok` to answer.txt); the scripted agent writes
the file, then waits: its second call is `bash sleep IDLE_S` (the sandbox holds a running
command while the agent waits on it, as it does on a slow build or test run), then submits,
and the task's own verifier runs. All N trials run at once (`workers = N`) through
agents.evaluation.run_eval and are committed to a lake in a temporary folder; the script
checks that the lake holds N committed trials and how many passed.

Printed: wall time, trials/s, peak number of trials idle at once, the memory per idle trial
(PSS and RSS of the sandbox processes, i.e. every descendant of this process, summed at the
sample with the most idle trials, divided by that count), this process's own RSS growth
per trial (the controller's threads and records), the load average (1 min) at the peak
and after, and the host's responsiveness under it (the worst latency of spawning `true`
while the trials run). Nothing asserts a time: numbers are for reading.

Not measured: docker (use --backend docker in rlpipe eval for that), or an agent that waits
with no command running (bwrap keeps no process between commands: such a trial costs only
its work dir and a controller thread).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlpipe.agents.agents import ScriptedAgent  # noqa: E402
from rlpipe.agents.evaluation import run_eval, start_eval  # noqa: E402
from rlpipe.agents.task_format import AgentTask, load_task  # noqa: E402
from rlpipe.agents.tools import tool_call_json  # noqa: E402
from rlpipe.agents.trial import TrialOptions  # noqa: E402
from rlpipe.storage.evals import EvalStore  # noqa: E402
from rlpipe.storage.lake import Lake  # noqa: E402
from rlpipe.storage.query import query_trajectories  # noqa: E402

TASK_TOML = """[agent]\ntimeout_sec = 600\nmax_steps = 5\n[verifier]\ntimeout_sec = 120\n
[environment]\nmemory_mb = 128\nstorage_mb = 8\n[metadata]\ncategory = "density"\n"""
TEST_SH = """#!/bin/sh\nif [ "$(cat /work/answer.txt 2>/dev/null)" = ok ]; then echo 1 > /logs/verifier/reward.txt; \
else echo 0 > /logs/verifier/reward.txt; fi\n"""
SAMPLE_EVERY_S = 0.25


def write_task(root: Path) -> AgentTask:
    folder = root / "density-echo"
    for path, text in {"task.toml": TASK_TOML, "instruction.md": "Write ok to /work/answer.txt, then submit.\n",
                       "environment/.keep": "", "solution/solve.sh": "#!/bin/sh\necho ok > /work/answer.txt\n",
                       "tests/test.sh": TEST_SH}.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    task = load_task(folder)
    assert isinstance(task, AgentTask), task
    return task


def descendants(root_pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, stack = [], [root_pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def memory_kb(pid: int) -> tuple[int, int]:
    """(PSS, RSS) in kB of one process, (0, 0) if it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    values = {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()[1:] if line.split()[1:2]}
    return values.get("Pss", 0), values.get("Rss", 0)


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


class Sampler(threading.Thread):
    """Samples the sandbox processes: the sample with the most idle trials (`sleep` running)."""

    def __init__(self, idle_s: float) -> None:
        super().__init__(daemon=True)
        self.idle_command = f"{idle_s:g}"
        self.stop = threading.Event()
        self.peak = (0, 0, 0, 0.0)  # (idle trials, PSS kB, RSS kB, load 1 min)
        self.worst_spawn_s = 0.0

    def run(self) -> None:
        me = os.getpid()
        while not self.stop.wait(SAMPLE_EVERY_S):
            pids = descendants(me)
            idle = sum(1 for pid in pids if command_of(pid).endswith("sleep") and self._sleeping(pid))
            usage = [memory_kb(pid) for pid in pids]
            if idle > self.peak[0]:
                self.peak = (idle, sum(u[0] for u in usage), sum(u[1] for u in usage), os.getloadavg()[0])
            started = time.monotonic()
            subprocess.run(["true"], check=True)
            self.worst_spawn_s = max(self.worst_spawn_s, time.monotonic() - started)

    def _sleeping(self, pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:2] == [self.idle_command.encode()]
        except OSError:
            return False


def rss_kb() -> int:
    return memory_kb(os.getpid())[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--idle-s", type=float, default=8.0, help="how long each agent waits on its sandbox's command")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agent-density-") as folder:
        root = Path(folder)
        task = write_task(root)
        tasks = [dataclasses.replace(task, task_id=f"density-{i:04d}") for i in range(args.trials)]
        replies = [tool_call_json("write_file", path="answer.txt", content="ok"),
                   tool_call_json("bash", command=f"sleep {args.idle_s:g}"), tool_call_json("submit")]
        store = EvalStore(Lake.open(str(root / "lake")))
        recorder = start_eval(store, "density", "scripted", "bwrap", root, tasks, TrialOptions(), max_attempts=1)
        sampler = Sampler(args.idle_s)
        baseline_rss_kb, load_before = rss_kb(), os.getloadavg()[0]
        sampler.start()
        started = time.monotonic()
        report = run_eval(tasks, "scripted", "bwrap", workers=args.trials, max_attempts=1, recorder=recorder,
                          factory=lambda _task: ScriptedAgent(list(replies)))
        wall_s = time.monotonic() - started
        sampler.stop.set()
        sampler.join()
        controller_kb = rss_kb() - baseline_rss_kb
        counted = query_trajectories(store.lake, "select count(*), sum(case when verdict = 'passed' then 1 else 0 end) "
                                     "from eval_trials where eval_id = 'density'").rows[0]
    idle, pss_kb, rss_sum_kb, load_peak = sampler.peak
    print(f"trials {args.trials}, idle {args.idle_s:g} s each, backend bwrap, {os.cpu_count()} CPUs")
    print(f"verdicts recorded in the lake: {counted[0]} of {args.trials}; passed {counted[1]}; "
          f"verdicts: {report.metrics['verdicts']}")
    print(f"wall {wall_s:.1f} s, {args.trials / wall_s:.2f} trials/s")
    if idle:
        print(f"peak idle trials at once: {idle}; sandbox processes then: PSS {pss_kb / 1024:.1f} MiB, RSS {rss_sum_kb / 1024:.1f} MiB; "
              f"per idle trial: PSS {pss_kb / idle:.0f} kB, RSS {rss_sum_kb / idle:.0f} kB")
    print(f"controller RSS growth: {controller_kb / 1024:.1f} MiB ({controller_kb / args.trials:.0f} kB per trial)")
    print(f"load average (1 min): {load_before:.2f} before, {load_peak:.2f} at the peak, {os.getloadavg()[0]:.2f} after; "
          f"worst spawn of `true` during the run: {sampler.worst_spawn_s * 1000:.0f} ms")


if __name__ == "__main__":
    main()
