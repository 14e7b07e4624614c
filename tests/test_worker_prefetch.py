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
