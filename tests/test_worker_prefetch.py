"""The worker's local queue (``prefetch``) and outcome window (``finish_window``), on
every in-process-testable backend: the same outcomes as without them, handler limits
kept, and a stop gives prefetched tasks back at once without spending an attempt."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from taskmill import (
    AttemptOutcome,
    Context,
    Priority,
    TaskFilter,
    Taskmill,
    TaskStatus,
)
from taskmill.testing import wait_until
from taskmill.worker import MAX_FINISH_BATCH

OPTIONS: dict[str, Any] = {
    "handle_signals": False,
    "min_poll_interval": 0.01,
    "poll_interval": 0.05,
}


async def until(condition: Callable[[], bool]) -> None:
    """Wait (generously) for a condition on the worker's own state."""

    async def probe() -> bool:
        return condition()

    await wait_until(probe, timeout=10)


async def test_prefetching_runs_every_task_once_with_batched_outcomes(tm: Taskmill):
    runs: Counter[int] = Counter()

    @tm.handler("noop")
    async def noop(ctx: Context, params: dict) -> int:
        runs[params["i"]] += 1
        return params["i"]

    await tm.enqueue_many([{"task_type": "noop", "params": {"i": i}} for i in range(300)])
    worker = tm.worker(concurrency=4, prefetch=50, finish_window=0.005, **OPTIONS)
    await worker.run_until_idle()
    assert worker.processed == 300 and worker.held == 0 and worker.queued == 0
    assert runs == Counter({i: 1 for i in range(300)})
    done = await tm.query(TaskFilter(task_types=("noop",)), limit=400)
    assert {t.status for t in done} == {TaskStatus.COMPLETED}
    assert {t.attempts for t in done} == {1}
    assert sorted(t.result for t in done) == list(range(300))


async def test_prefetched_tasks_count_against_the_handler_limit(tm: Taskmill):
    running = 0
    most = 0

    @tm.handler("capped", concurrency=2)
    async def capped(ctx: Context, params: dict) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1

    await tm.enqueue_many([{"task_type": "capped"} for _ in range(20)])
    worker = tm.worker(concurrency=8, prefetch=100, **OPTIONS)
    waiting = asyncio.create_task(worker.run_until_idle())
    while not waiting.done():
        # Claimed (running or queued) never exceeds the handler's limit.
        assert worker.running + worker.queued <= 2
        await asyncio.sleep(0.002)
    await waiting
    assert most == 2 and worker.processed == 20


async def test_a_stop_gives_prefetched_tasks_back_without_spending_an_attempt(tm: Taskmill):
    started = asyncio.Event()

    @tm.handler("slow")
    async def slow(ctx: Context, params: dict) -> None:
        started.set()
        await asyncio.sleep(60)

    tasks = await tm.enqueue_many([{"task_type": "slow"} for _ in range(10)])
    worker = tm.worker(concurrency=2, reserved_high_priority_slots=0, prefetch=8, **OPTIONS)
    running = asyncio.create_task(worker.run())
    async with asyncio.timeout(10):
        await started.wait()
    await until(lambda: worker.queued == 8)
    async with asyncio.timeout(10):
        await worker.stop(grace=0.1)
        await running
    back = [await tm.get(t.id) for t in tasks]
    assert all(t is not None and t.status is TaskStatus.PENDING for t in back)
    assert all(t is not None and t.attempts == 0 and t.worker_id is None for t in back)
    outcomes: Counter[AttemptOutcome] = Counter()
    for t in tasks:
        outcomes.update(a.outcome for a in await tm.attempts(t.id))
    assert outcomes == Counter({AttemptOutcome.INTERRUPTED: 10})


async def test_queued_tasks_start_highest_priority_first(tm: Taskmill):
    order: list[str] = []
    gate = asyncio.Event()

    @tm.handler("t")
    async def t(ctx: Context, params: dict) -> None:
        if params["name"] == "first":
            await gate.wait()
        order.append(params["name"])

    await tm.enqueue("t", {"name": "first"}, priority=Priority.USER_ACTION)
    worker = tm.worker(concurrency=1, prefetch=10, **OPTIONS)
    running = asyncio.create_task(worker.run())
    await until(lambda: worker.running == 1)
    await tm.enqueue_many(
        [{"task_type": "t", "params": {"name": f"low{i}"}} for i in range(3)]
        + [{"task_type": "t", "params": {"name": "high"}, "priority": Priority.USER_ACTION}]
    )
    await until(lambda: worker.queued == 4)
    gate.set()
    await until(lambda: len(order) == 5)
    await worker.stop(grace=5)
    await running
    assert order[:2] == ["first", "high"]
    assert sorted(order[2:]) == ["low0", "low1", "low2"]


@pytest.mark.parametrize(("field", "value"), [("prefetch", -1), ("finish_window", -0.1)])
def test_negative_prefetch_or_window_is_refused(tm: Taskmill, field: str, value: Any):
    bad: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=field):
        tm.worker(**bad)


async def test_tick_claims_into_free_slots_only(tm: Taskmill):
    @tm.handler("noop")
    async def noop(ctx: Context, params: dict) -> None:
        return None

    await tm.enqueue_many([{"task_type": "noop"} for _ in range(10)])
    worker = tm.worker(concurrency=3, reserved_high_priority_slots=0, prefetch=50, **OPTIONS)
    assert await worker.tick() == 3
    assert worker.queued == 0 and worker.held == 0


async def test_claims_resume_while_a_backlog_of_outcomes_is_still_being_written():
    """Each written batch of outcomes frees its slots at once: with a backlog larger
    than one write, the worker claims into the freed slots while the rest of the
    backlog is written, instead of leaving the store's claim side idle until the whole
    backlog is written (which halved PostgreSQL throughput at concurrency 100)."""
    async with Taskmill("memory://", plugins=False) as tm:

        @tm.handler("noop")
        async def noop(ctx: Context, params: dict) -> None:
            return None

        storage = tm.storage
        writing = 0
        claims_during_writes = 0
        claim_batch, finish_batch_applied = storage.claim_batch, storage.finish_batch_applied

        async def slow_finish(finishes: Any) -> Any:
            nonlocal writing
            writing += 1
            try:
                await asyncio.sleep(0.05)  # a store slower to write than to claim
                return await finish_batch_applied(finishes)
            finally:
                writing -= 1

        async def counted_claim(request: Any) -> Any:
            nonlocal claims_during_writes
            claims_during_writes += writing > 0
            return await claim_batch(request)

        storage.finish_batch_applied = slow_finish  # type: ignore[method-assign]
        storage.claim_batch = counted_claim  # type: ignore[method-assign]
        await tm.enqueue_many([{"task_type": "noop"} for _ in range(2400)])
        # The window gathers every outcome of a claim into one backlog of 1,200: more
        # than one write (MAX_FINISH_BATCH) carries.
        assert MAX_FINISH_BATCH < 1200
        worker = tm.worker(concurrency=600, prefetch=600, finish_window=0.2, **OPTIONS)
        await worker.run_until_idle()
        assert worker.processed == 2400
        assert claims_during_writes > 0
