"""How rlpipe's deployments are scheduled and limited, declared once: the nightly schedule,
the work pool and its queues with priorities, and the concurrency limits. The served
deployments of `rlpipe up` (flows/serve.py) take them from here; prefect.yaml at the
repository root repeats the same names and numbers for `prefect deploy --all` (YAML cannot
import them), and `apply_operations` creates the pool, queues and limits on a server
(`python -m rlpipe.flows.operations` against PREFECT_API_URL; `rlpipe up` does it itself).

- Schedule: nightly at 03:00 UTC, declared inactive (turn it on in the UI). Every scheduled
  flow run leaves run_id empty, so each night starts a run of its own (flows/run_parameters.py).
- Work pool `rlpipe-cpu` (process), queues by priority (1 is served first): `eval` ahead
  of `train`, then `default`. A worker polls them in that order.
- Concurrency: one train flow run at a time per deployment (the trainer owns the machine's
  GPU or cores); every deployment's train run holds a slot of the global limit
  `rlpipe-trainer` (one per GPU) while its trainer lives (flows/train.py), so train runs of
  all deployments on one server share it; `rlpipe-sandbox` (sandbox slots) and the tag
  limit `verify` are declared for tasks to take (none does yet: stage tasks carry no tags).

What it does not: start workers or servers, or decide what a run computes.
"""

from __future__ import annotations

from dataclasses import dataclass

NIGHTLY_CRON = "0 3 * * *"
TRAIN_TAGS = ("rlpipe", "train")
TRAIN_CONCURRENCY = 1
WORK_POOL = "rlpipe-cpu"
TRAINER_LIMIT = "rlpipe-trainer"
TRAINER_LEASE_S = 60
"""The trainer slot's lease (Prefect's minimum): renewed while the run lives; a run killed
with -9 frees its slot this long after its last renewal."""


@dataclass(frozen=True)
class Queue:
    name: str
    priority: int
    """1 is served first."""
    concurrency_limit: int | None = None


QUEUES = (Queue("eval", 1), Queue("train", 2, concurrency_limit=1), Queue("default", 3))
GLOBAL_LIMITS = {TRAINER_LIMIT: 1, "rlpipe-sandbox": 8}
"""Global concurrency limits (name -> slots): one trainer per GPU, N sandbox slots."""
TAG_LIMITS = {"verify": 4}
"""Task-run concurrency by tag (tag -> task runs at once)."""


async def apply_operations(client) -> list[str]:
    """Create (or update) the work pool, its queues, and the limits on the server `client`
    talks to; return one line per object. Idempotent."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate, WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    done = []
    try:
        await client.create_work_pool(WorkPoolCreate(name=WORK_POOL, type="process"))
    except ObjectAlreadyExists:
        pass
    done.append(f"work pool {WORK_POOL} (process)")
    for queue in QUEUES:
        try:
            existing = await client.read_work_queue_by_name(queue.name, work_pool_name=WORK_POOL)
        except ObjectNotFound:
            await client.create_work_queue(name=queue.name, work_pool_name=WORK_POOL, priority=queue.priority,
                                           concurrency_limit=queue.concurrency_limit)
        else:
            await client.update_work_queue(existing.id, priority=queue.priority, concurrency_limit=queue.concurrency_limit)
        done.append(f"work queue {WORK_POOL}/{queue.name} priority {queue.priority}")
    for name, slots in GLOBAL_LIMITS.items():
        try:
            await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=slots))
        except ObjectAlreadyExists:
            await client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=slots))
        done.append(f"global concurrency limit {name} = {slots}")
    for tag, slots in TAG_LIMITS.items():
        await client.create_concurrency_limit(tag=tag, concurrency_limit=slots)  # an upsert
        done.append(f"tag concurrency limit {tag} = {slots}")
    return done


def main() -> None:
    """`python -m rlpipe.flows.operations`: apply them to the server of PREFECT_API_URL."""
    import asyncio

    from prefect.client.orchestration import get_client

    async def apply() -> list[str]:
        async with get_client() as client:
            return await apply_operations(client)

    for line in asyncio.run(apply()):
        print(line, flush=True)


if __name__ == "__main__":
    main()
