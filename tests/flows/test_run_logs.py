"""The flow run's logs carry the run's progress (orchestration/run_log.py), read back through
Prefect's API as the UI's Logs tab reads them: the MLflow run, the warm start's steps and
accuracy checks, and one line per RL step with its reward and time. And the warm start's
lines are thinned by time, not by step count."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.client.schemas.sorting import LogSort
from prefect.logging.handlers import APILogHandler

from rlpipe.flows.train import train
from rlpipe.orchestration.run_log import WarmStartLines
from tests.flows.runs import tiny_config

STEPS, WARM_STEPS = 2, 5


def test_the_flow_runs_logs_say_where_the_warm_start_and_each_rl_step_are(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, f"train.steps={STEPS}", f"warmstart.steps={WARM_STEPS}", "warmstart.check_every_steps=2",
                         "warmstart.target_accuracy=1.0", "warmstart.check_tasks=8")  # 1.0: out of reach, all 5 steps run
    summary = train(config, "logged")
    messages = asyncio.run(_flow_run_logs(summary.prefect_flow_run_id))
    links = [line for line in messages if line.startswith("MLflow run: ")]
    assert len(links) == 1 and summary.mlflow_run_id in links[0], messages  # its URL, or the store and run id
    assert any(re.fullmatch(rf"warm-start step 1/{WARM_STEPS}: loss \d+\.\d+", line) for line in messages), messages
    assert any(line.startswith("warm-start step 2: greedy accuracy on training tasks") for line in messages), messages
    assert any(line.startswith(f"warm start done: {WARM_STEPS} of at most {WARM_STEPS} steps") for line in messages), messages
    steps = [line for line in messages if line.startswith("RL step ")]
    assert len(steps) == STEPS, messages
    for step, line in enumerate(steps, start=1):
        # the loss is left out of a step whose groups all lacked a signal (no update)
        assert re.fullmatch(rf"RL step {step}/{STEPS}: reward \d\.\d{{3}}(, loss \S+)?, \d+\.\d s", line), line


def test_warm_start_lines_come_at_most_every_interval_and_at_the_end() -> None:
    now = [0.0]
    lines = WarmStartLines(100, every_s=30.0, clock=lambda: now[0])
    logged: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record.getMessage())

    handler = Collect()
    logger = logging.getLogger("rlpipe.orchestration.run_log")
    logger.addHandler(handler)
    previous_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        for step in range(1, 11):  # steps 10 s apart: logged at 0 s, 30 s, 60 s, 90 s
            lines.step(step, 1.0 / step)
            now[0] += 10.0
        lines.finish()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)
    assert [line.split(":")[0] for line in logged] == [
        "warm-start step 1/100", "warm-start step 4/100", "warm-start step 7/100", "warm-start step 10/100",
        "warm start done"]
    assert logged[-1] == "warm start done: 10 of at most 100 steps, last loss 0.1000"


async def _flow_run_logs(flow_run_id: str) -> list[str]:
    await APILogHandler.aflush()  # the lines still queued in this process go to the API first
    async with get_client() as client:
        logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                                      sort=LogSort.TIMESTAMP_ASC)
    return [log.message for log in logs]
