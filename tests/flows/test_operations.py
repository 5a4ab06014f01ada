"""The work pool, queues and limits declared in flows/operations.py are created on a server
as declared, and applying them again (a second `rlpipe up` on the same server) changes
nothing and raises nothing. Runs on the session's Prefect server; what it creates is
deleted at the end, so no other test meets the `verify` tag limit."""

from __future__ import annotations

import asyncio

from prefect.client.orchestration import get_client

from rlpipe.flows.operations import GLOBAL_LIMITS, QUEUES, TAG_LIMITS, WORK_POOL, apply_operations


def test_operations_are_created_as_declared_and_applying_them_twice_is_harmless(prefect_api_url: str) -> None:
    first, second, queues, limits, tags = asyncio.run(_apply_twice_and_read())
    assert first == second and len(first) == 1 + len(QUEUES) + len(GLOBAL_LIMITS) + len(TAG_LIMITS)
    assert queues == {"eval": (1, None), "train": (2, 1), "default": (3, None)}  # eval ahead of train; one train run
    assert limits == {"rlpipe-trainer": 1, "rlpipe-sandbox": 8}
    assert tags == {"verify": 4}


async def _apply_twice_and_read():
    async with get_client() as client:
        try:
            first = await apply_operations(client)
            second = await apply_operations(client)
            queues = {queue.name: (queue.priority, queue.concurrency_limit)
                      for queue in await client.read_work_queues(work_pool_name=WORK_POOL)}
            limits = {limit.name: limit.limit for limit in await client.read_global_concurrency_limits(limit=50)
                      if limit.name in GLOBAL_LIMITS}
            tags = {limit.tag: limit.concurrency_limit for limit in await client.read_concurrency_limits(limit=50, offset=0)
                    if limit.tag in TAG_LIMITS}
        finally:
            for tag in TAG_LIMITS:
                await client.delete_concurrency_limit_by_tag(tag)
            for name in GLOBAL_LIMITS:
                await client.delete_global_concurrency_limit_by_name(name)
            await client.delete_work_pool(WORK_POOL)
    return first, second, queues, limits, tags
