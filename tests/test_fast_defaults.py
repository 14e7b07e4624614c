"""The worker's fast defaults (issue 27): a local queue sized from the worker's pace
(``prefetch`` auto) and a 2 ms finish window, with the number of tasks held but not
started bounded, their leases renewed while they wait, and ``prefetch=0`` and
``finish_window=0`` still meaning off."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from taskmill import Context, TaskFilter, Taskmill, TaskStatus, WorkerOptions, claiming
from taskmill.claiming import AUTO_PREFETCH_MAX, auto_prefetch

OPTIONS: dict[str, Any] = {
    "handle_signals": False,
    "min_poll_interval": 0.01,
    "poll_interval": 0.05,
}


def test_the_defaults_are_a_local_queue_sized_from_the_pace_and_a_2_ms_window():
    options = WorkerOptions()
    assert options.prefetch is None  # auto
    assert options.finish_window == 0.002


def test_the_auto_queue_is_bounded_and_off_for_slow_handlers():
    # About 0.1 s of work at the measured rate, at most AUTO_PREFETCH_MAX.
    assert auto_prefetch(20_000, 10) == AUTO_PREFETCH_MAX
    assert auto_prefetch(1_000_000, 100) == AUTO_PREFETCH_MAX
    assert auto_prefetch(2_000, 10) == 200
    # Less than one task per slot: nothing is held unstarted.
    assert auto_prefetch(50, 10) == 0
    assert auto_prefetch(0, 1) == 0


async def test_a_default_worker_holds_at_most_the_bound_unstarted(tm: Taskmill):
    runs: Counter[int] = Counter()

    @tm.handler("noop")
    async def noop(ctx: Context, params: dict) -> None:
        runs[params["i"]] += 1

    await tm.enqueue_many([{"task_type": "noop", "params": {"i": i}} for i in range(3000)])
    worker = tm.worker(concurrency=4, **OPTIONS)
    draining = asyncio.create_task(worker.run_until_idle())
    most_queued = 0
    while not draining.done():
        most_queued = max(most_queued, worker.queued)
        assert worker.queued <= AUTO_PREFETCH_MAX
        assert worker.held <= worker.concurrency + AUTO_PREFETCH_MAX
        await asyncio.sleep(0.001)
    await draining
    assert worker.processed == 3000 and worker.held == 0 and worker.queued == 0
    assert runs == Counter({i: 1 for i in range(3000)})
    done = await tm.query(TaskFilter(task_types=("noop",)), limit=3001)
    assert {t.status for t in done} == {TaskStatus.COMPLETED}
    assert {t.attempts for t in done} == {1}


async def test_slow_handlers_are_not_prefetched_by_default(tm: Taskmill):
    @tm.handler("slow")
    async def slow(ctx: Context, params: dict) -> None:
        await asyncio.sleep(0.2)

    await tm.enqueue_many([{"task_type": "slow"} for _ in range(12)])
    worker = tm.worker(concurrency=4, reserved_high_priority_slots=0, **OPTIONS)
    draining = asyncio.create_task(worker.run_until_idle())
    while not draining.done():
        # 4 slots at 5 tasks/s each: 2 tasks in 0.1 s, less than one per slot.
        assert worker.queued == 0
        await asyncio.sleep(0.005)
    await draining
    assert worker.processed == 12


async def test_prefetch_0_and_finish_window_0_still_mean_off(tm: Taskmill):
    writes: list[int] = []

    @tm.handler("noop")
    async def noop(ctx: Context, params: dict) -> None:
        return None

    finish = tm.storage.finish_batch_applied

    async def counted(finishes: Any) -> Any:
        writes.append(len(finishes))
        return await finish(finishes)

    tm.storage.finish_batch_applied = counted  # type: ignore[method-assign]
    await tm.enqueue_many([{"task_type": "noop"} for _ in range(1000)])
    worker = tm.worker(concurrency=4, prefetch=0, finish_window=0, **OPTIONS)
    assert worker.prefetch == 0 and worker.finish_window == 0
    draining = asyncio.create_task(worker.run_until_idle())
    while not draining.done():
        assert worker.queued == 0
        assert worker.held <= worker.concurrency
        await asyncio.sleep(0.001)
    await draining
    assert worker.processed == 1000 and max(writes) <= worker.concurrency


@pytest.mark.parametrize("prefetch", [None, 6], ids=["auto", "explicit"])
async def test_queued_tasks_keep_their_leases_while_they_wait(
    tm: Taskmill, monkeypatch: pytest.MonkeyPatch, prefetch: int | None
):
    """Tasks wait in the local queue for several leases; their leases are renewed with
    the running ones, so a rescue (here every 50 ms, from outside the worker) never
    takes them, and each runs once."""
    # Auto: queue many seconds of work, so these slow tasks are prefetched too.
    monkeypatch.setattr(claiming, "AUTO_QUEUE_SECONDS", 100.0)
    runs: Counter[str] = Counter()

    @tm.handler("slow")
    async def slow(ctx: Context, params: dict) -> None:
        runs[ctx.task.id] += 1
        await asyncio.sleep(0.12)

    tasks = await tm.enqueue_many([{"task_type": "slow"} for _ in range(8)])
    args: dict[str, Any] = {} if prefetch is None else {"prefetch": prefetch}
    worker = tm.worker(
        concurrency=1, lease_seconds=0.3, reserved_high_priority_slots=0, **args, **OPTIONS
    )
    draining = asyncio.create_task(worker.run_until_idle())
    rescued = 0
    most_queued = 0
    while not draining.done():
        most_queued = max(most_queued, worker.queued)
        rescued += len(await tm.storage.rescue_expired())
        await asyncio.sleep(0.05)
    await draining
    # The last queued task waited about 7 * 0.12 s: nearly three leases.
    assert most_queued >= 5
    assert rescued == 0
    assert runs == Counter({t.id: 1 for t in tasks})
    for t in tasks:
        stored = await tm.get(t.id)
        assert stored is not None and stored.status is TaskStatus.COMPLETED
        assert stored.attempts == 1
