"""The training-time budget of one run in benchmarks/vs_trl.py's race: wall and CPU seconds
of training, RL steps, the loop's stage timings and held-out points, with the clocks
stopped while an evaluation runs. What it does not: run anything (vs_trl.py does)."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

import torch
from cli_steps import StepTimes

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


class Budget:
    """The training time of one run: `seconds` on the chosen clock; wall and CPU both
    recorded. Every `eval_every` seconds of training (0 = never) the run's held-out accuracy
    is measured with the clocks stopped (`checkpoint`), for the accuracy-over-time curve."""

    def __init__(self, seconds: float, clock: str, eval_every: float = 0.0, evaluate=None, steps: int = 0) -> None:
        self.seconds, self.clock, self.steps = seconds, CLOCKS[clock], steps
        self.eval_every, self.evaluate = eval_every, evaluate
        self.curve: list[tuple[float, float]] = []  # (training seconds, held-out accuracy)
        self.stage_walls: dict[str, list[float]] = defaultdict(list)  # the loop's stages, per RL step
        self.start()

    def start(self) -> None:
        self.started, self.wall_started, self.cpu_started = self.clock(), time.perf_counter(), time.process_time()
        self.paused = (0.0, 0.0, 0.0)  # clock, wall, cpu seconds spent evaluating
        self.marks: list[tuple[float, float]] = [self.used()]  # (wall, cpu) of training at the start and each step's end

    def elapsed(self) -> float:
        return self.clock() - self.started - self.paused[0]

    def spent(self) -> bool:
        """`seconds` of training are over, or (`steps` > 0) that many RL steps are done."""
        return self.elapsed() >= self.seconds or 0 < self.steps < len(self.marks)

    def step_done(self, timings: dict[str, float] | None = None) -> None:
        """A step ended; `timings`: its StageClock's (`time/<stage>_s`)."""
        self.marks.append(self.used())
        for name, seconds in (timings or {}).items():
            self.stage_walls[name.removeprefix("time/").removesuffix("_s")].append(seconds)

    def periods(self) -> StepTimes:
        """Wall and CPU seconds of each RL step after the first (the first warms caches up),
        and the median wall seconds of each stage the loop timed over the same steps."""
        walls, cpus = ([b[i] - a[i] for a, b in zip(self.marks[1:], self.marks[2:])] for i in (0, 1))
        stages = {name: statistics.median(values[1:]) for name, values in self.stage_walls.items() if len(values) > 1}
        return StepTimes(walls, cpus, stages)

    def checkpoint(self, model: torch.nn.Module) -> None:
        """Measure held-out accuracy if the next curve point is due (time not counted)."""
        if not self.eval_every or self.evaluate is None or self.elapsed() < self.eval_every * (len(self.curve) + 1):
            return
        at, before = self.elapsed(), (self.clock(), time.perf_counter(), time.process_time())
        self.curve.append((at, self.evaluate(model)))
        after = (self.clock(), time.perf_counter(), time.process_time())
        self.paused = tuple(total + end - begin for total, begin, end in zip(self.paused, before, after))

    def used(self) -> tuple[float, float]:
        """(wall seconds, CPU seconds) of training since start."""
        return (time.perf_counter() - self.wall_started - self.paused[1],
                time.process_time() - self.cpu_started - self.paused[2])
