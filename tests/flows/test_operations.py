"""flows/operations.py's declarations reach a Prefect server and stay true there:
`apply_operations` creates the work pool, its queues and the limits as declared; applying
again (a second `rlpipe up` on the same server) raises nothing and puts back what was
changed on the server by hand. And the two prefect.yaml files, which repeat the names and
numbers because YAML cannot import them, agree with the declarations.

What it does not: restate the numbers (they are compared with operations.py's own
constants), or check that a worker serves the queues in priority order (Prefect's job).
Runs on the session's Prefect server; what it creates is deleted at the end, so no other
test meets the `verify` tag limit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client

from rlpipe.flows.operations import (GLOBAL_LIMITS, NIGHTLY_CRON, QUEUES, TAG_LIMITS, TRAIN_CONCURRENCY, TRAIN_TAGS,
                                     WORK_POOL, apply_operations)

REPO = Path(__file__).resolve().parents[2]
DECLARED_QUEUES = {queue.name: (queue.priority, queue.concurrency_limit) for queue in QUEUES}


def test_operations_are_created_as_declared_and_applying_again_restores_them(prefect_api_url: str) -> None:
    first, created, second, restored = asyncio.run(_apply_drift_and_apply_again())
    assert created == restored == (DECLARED_QUEUES, GLOBAL_LIMITS, TAG_LIMITS)
    assert first == second and len(first) == 1 + len(QUEUES) + len(GLOBAL_LIMITS) + len(TAG_LIMITS)


@pytest.mark.parametrize("prefect_file", ["prefect.yaml", "deploy/prefect.yaml"])
def test_the_prefect_files_repeat_the_declared_pool_queues_and_schedule(prefect_file: str) -> None:
    document = yaml.safe_load((REPO / prefect_file).read_text())
    deployments = document["deployments"]
    assert {deployment["work_pool"]["name"] for deployment in deployments} == {WORK_POOL}
    assert {deployment["work_pool"]["work_queue_name"] for deployment in deployments} <= set(DECLARED_QUEUES)
    train = [deployment for deployment in deployments if deployment["work_pool"]["work_queue_name"] == "train"]
    assert train, f"{prefect_file} has no deployment on the train queue"
    for deployment in train:
        assert tuple(deployment["tags"]) == TRAIN_TAGS
        assert deployment["concurrency_limit"] == TRAIN_CONCURRENCY
    crons = [schedule["cron"] for schedule in document["definitions"]["schedules"].values()]
    assert crons == [NIGHTLY_CRON]


async def _apply_drift_and_apply_again():
    async with get_client() as client:
        try:
            first = await apply_operations(client)
            created = await _read(client)
            await _drift(client)
            second = await apply_operations(client)
            restored = await _read(client)
        finally:
            for tag in TAG_LIMITS:
                await client.delete_concurrency_limit_by_tag(tag)
            for name in GLOBAL_LIMITS:
                await client.delete_global_concurrency_limit_by_name(name)
            await client.delete_work_pool(WORK_POOL)
    return first, created, second, restored


async def _read(client) -> tuple[dict, dict, dict]:
    queues = {queue.name: (queue.priority, queue.concurrency_limit)
              for queue in await client.read_work_queues(work_pool_name=WORK_POOL)}
    limits = {limit.name: limit.limit for limit in await client.read_global_concurrency_limits(limit=50)
              if limit.name in GLOBAL_LIMITS}
    tags = {limit.tag: limit.concurrency_limit for limit in await client.read_concurrency_limits(limit=50, offset=0)
            if limit.tag in TAG_LIMITS}
    return queues, limits, tags


async def _drift(client) -> None:
    """Change every queue and limit on the server as a user might in the UI."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    for queue in QUEUES:
        existing = await client.read_work_queue_by_name(queue.name, work_pool_name=WORK_POOL)
        await client.update_work_queue(existing.id, priority=queue.priority + 10, concurrency_limit=7)
    for name, slots in GLOBAL_LIMITS.items():
        await client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=slots + 5))
    for tag, slots in TAG_LIMITS.items():
        await client.create_concurrency_limit(tag=tag, concurrency_limit=slots + 3)
    assert await _read(client) != (DECLARED_QUEUES, GLOBAL_LIMITS, TAG_LIMITS)  # the drift took
