"""What one agent trial costs the machine on each sandbox backend: CPU seconds (every process
on the machine, the docker engine and its containers included) and docker execs per trial.

    .venv/bin/python benchmarks/trial_cost.py [--trials 6] [--probe planted_rewards_and_fake_tests]

Each trial is fix-median-bug (the built-in suite) played by a scripted agent: one bash call,
the probe's command (rlpipe/qa/agent_probes.py), then submit; the task's tests run and the
trial is scored (agents/trial.py: run_trial, as `rlpipe eval` and the quality gate run it).
The backends alternate trial by trial, after one untimed trial each (the first trial of a
process pays for image checks and imports). CPU is the machine's, from /proc/stat, over each
trial: run it on a quiet machine. Docker execs are counted at the docker SDK's exec_create.
Printed per backend: median and range of wall seconds, machine CPU seconds and execs per
trial. Nothing asserts a figure: numbers are for reading (docs/RESULTS.md, "The test
suite's time", says why a docker trial's cost is CI's).

Not measured: trials run at once (benchmarks/agent_density.py), or a task that needs its own
image (the first trial builds it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlpipe.agents.agents import ScriptedAgent  # noqa: E402
from rlpipe.agents.task_format import builtin_suite_dir, load_task  # noqa: E402
from rlpipe.agents.tools import tool_call_json  # noqa: E402
from rlpipe.agents.trial import run_trial  # noqa: E402
from rlpipe.qa.agent_probes import PROBES  # noqa: E402
from scripts.cpu_by_process import machine_cpu_s  # noqa: E402

EXECS = [0]


def count_docker_execs() -> None:
    import docker.api.exec_api

    create = docker.api.exec_api.ExecApiMixin.exec_create

    def counted(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003 - the SDK's signature
        EXECS[0] += 1
        return create(self, *args, **kwargs)

    docker.api.exec_api.ExecApiMixin.exec_create = counted


def one_trial(backend: str, probe: str) -> tuple[float, float, int]:
    task = load_task(builtin_suite_dir() / "fix-median-bug")
    replies = [tool_call_json("bash", command=PROBES[probe]), tool_call_json("submit")]
    execs, cpu, started = EXECS[0], machine_cpu_s(), time.perf_counter()
    result = run_trial(task, "cost", lambda _task: ScriptedAgent(list(replies)), backend)
    if result.verdict.family != "agent":
        raise SystemExit(f"{backend}: the trial ended as {result.verdict.value}: {result.detail}")
    return time.perf_counter() - started, machine_cpu_s() - cpu, EXECS[0] - execs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6, help="timed trials per backend")
    parser.add_argument("--probe", default="planted_rewards_and_fake_tests", choices=sorted(PROBES))
    parser.add_argument("--backends", default="bwrap,docker")
    args = parser.parse_args()
    backends = args.backends.split(",")
    count_docker_execs()
    for backend in backends:
        one_trial(backend, args.probe)  # untimed
    measured: dict[str, list[tuple[float, float, int]]] = {backend: [] for backend in backends}
    for _ in range(args.trials):
        for backend in backends:
            measured[backend].append(one_trial(backend, args.probe))
    print(f"{args.trials} trials per backend, probe {args.probe}; median (min-max)")
    for backend, rows in measured.items():
        columns = []
        for index, name in enumerate(("wall s", "machine CPU s", "docker execs")):
            values = [row[index] for row in rows]
            columns.append(f"{name} {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        print(f"{backend:7s} " + ", ".join(columns))


if __name__ == "__main__":
    main()
