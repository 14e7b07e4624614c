"""Batch calls as one unit (taskmill.batch_calls): a batch handler's tasks run as one
asyncio task per batch, not one per task, with the semantics of docs/batches.md kept:
members leaving while the batch gathers or while it runs, a thread's batch, a worker
stopping mid-call, a handed-over member, and the general path kept for plugins that
wrap every handler call."""

from __future__ import annotations

import asyncio
import functools
import gc
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import pytest
from taskmill import (
    BatchOptions,
    CancelReason,
    Context,
    Detached,
    Task,
    Taskmill,
    TaskStatus,
    hookimpl,
)
from taskmill.testing import wait_until

OPTIONS: dict[str, Any] = {
    "handle_signals": False,
    "min_poll_interval": 0.01,
    "reserved_high_priority_slots": 0,
    "cancel_check_interval": 0.05,
}


async def _status(tm: Taskmill, task_id: str) -> TaskStatus | None:
    stored = await tm.get(task_id)
    return None if stored is None else stored.status


async def _all_running(tm: Taskmill, tasks: Sequence[Task]) -> bool:
    return {await _status(tm, t.id) for t in tasks} == {TaskStatus.RUNNING}


async def test_a_running_batch_is_one_asyncio_task_not_one_per_member(tm: Taskmill):
    release = asyncio.Event()
    tasks_during_call: list[int] = []

    @tm.handler("bulk", batch=BatchOptions(max_size=50, max_wait=5))
    async def bulk(batch: list[Context]) -> list[int]:
        tasks_during_call.append(len(asyncio.all_tasks()))
        await release.wait()
        return [len(batch)] * len(batch)

    tasks = await tm.enqueue_many([{"task_type": "bulk"} for _ in range(50)])
    before = len(asyncio.all_tasks())
    worker = tm.worker(concurrency=50, prefetch=0, **OPTIONS)
    running = asyncio.create_task(worker.run_until_idle())

    async def called() -> bool:
        return bool(tasks_during_call)

    await wait_until(called, timeout=20)
    # The worker's own duties and the batch's task; 50 members would be 50 more.
    assert tasks_during_call[0] - before < 20, tasks_during_call
    release.set()
    await running
    for task in tasks:
        stored = await tm.get(task.id)
        assert stored is not None and (stored.status, stored.result) == (
            TaskStatus.COMPLETED,
            50,
        )


async def test_a_member_cancelled_while_the_batch_gathers_is_left_out_of_the_call(
    tm: Taskmill,
):
    calls: list[list[str]] = []

    @tm.handler("gather", batch=BatchOptions(max_size=3, max_wait=1.5))
    async def gather(batch: list[Context]) -> list[str]:
        calls.append([ctx.task.id for ctx in batch])
        return ["sent"] * len(batch)

    a, b = await tm.enqueue_many([{"task_type": "gather"} for _ in range(2)])
    worker = tm.worker(concurrency=3, **OPTIONS)
    running = asyncio.create_task(worker.run_until_idle())

    await wait_until(functools.partial(_all_running, tm, [a, b]), timeout=20)
    assert calls == []  # still gathering: two of three, max_wait not over
    await tm.cancel(b.id, reason=CancelReason.USER)
    await running
    assert calls == [[a.id]]
    assert await _status(tm, a.id) is TaskStatus.COMPLETED
    cancelled = await tm.get(b.id)
    assert cancelled is not None and cancelled.status is TaskStatus.CANCELLED
    assert [x.outcome.value for x in await tm.attempts(b.id)] == ["cancelled"]


async def test_a_batch_every_member_left_before_its_call_is_never_called(tm: Taskmill):
    calls: list[int] = []

    @tm.handler("never", batch=BatchOptions(max_size=5, max_wait=60))
    async def never(batch: list[Context]) -> list[None]:
        calls.append(len(batch))
        return [None] * len(batch)

    tasks = await tm.enqueue_many([{"task_type": "never"} for _ in range(2)])
    worker = tm.worker(concurrency=5, **OPTIONS)
    running = asyncio.create_task(worker.run_until_idle())

    await wait_until(functools.partial(_all_running, tm, tasks), timeout=20)
    started = time.monotonic()
    for task in tasks:
        await tm.cancel(task.id, reason=CancelReason.USER)
    await asyncio.wait_for(running, timeout=20)
    assert time.monotonic() - started < 20  # not the 60 s max_wait
    assert calls == []
    assert {await _status(tm, t.id) for t in tasks} == {TaskStatus.CANCELLED}


async def test_a_member_of_a_thread_batch_leaves_when_cancelled(tm: Taskmill):
    release = threading.Event()
    seen_cancelled: dict[str, bool] = {}

    @tm.handler("threaded", batch=BatchOptions(max_size=3, max_wait=5))
    def threaded(batch: list[Context]) -> list[str]:
        release.wait(30)
        for ctx in batch:
            seen_cancelled[ctx.task.id] = ctx.cancelled
        return ["done"] * len(batch)

    a, b, c = await tm.enqueue_many([{"task_type": "threaded"} for _ in range(3)])
    worker = tm.worker(concurrency=3, **OPTIONS)
    running = asyncio.create_task(worker.run_until_idle())
    try:
        await wait_until(functools.partial(_all_running, tm, [a, b, c]), timeout=20)
        await tm.cancel(b.id, reason=CancelReason.USER)

        # b's attempt ends while the thread still runs: its slot is free again.
        async def b_left() -> bool:
            return worker.held == 2

        await wait_until(b_left, timeout=20)
        assert await _status(tm, b.id) is TaskStatus.CANCELLED
    finally:
        release.set()
    await running
    assert seen_cancelled == {a.id: False, b.id: True, c.id: False}
    assert await _status(tm, a.id) is TaskStatus.COMPLETED
    assert await _status(tm, c.id) is TaskStatus.COMPLETED
    assert [x.outcome.value for x in await tm.attempts(b.id)] == ["cancelled"]


async def test_a_worker_stopping_mid_call_gives_the_members_back(tm: Taskmill):
    started = asyncio.Event()

    @tm.handler("long", batch=BatchOptions(max_size=2, max_wait=5))
    async def long(batch: list[Context]) -> list[None]:
        started.set()
        await asyncio.sleep(60)
        return [None] * len(batch)

    tasks = await tm.enqueue_many([{"task_type": "long"} for _ in range(2)])
    worker = tm.worker(concurrency=2, **OPTIONS)
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), timeout=20)
    began = time.monotonic()
    await worker.stop(grace=0)
    await asyncio.wait_for(running, timeout=20)
    assert time.monotonic() - began < 20
    for task in tasks:
        stored = await tm.get(task.id)
        # Back to PENDING, the attempt not spent (an interrupted attempt).
        assert stored is not None and stored.status is TaskStatus.PENDING
        assert [x.outcome.value for x in await tm.attempts(task.id)] == ["interrupted"]


async def test_a_detached_outcome_hands_that_member_over(tm: Taskmill):
    @tm.handler("handover", batch=BatchOptions(max_size=2, max_wait=5))
    async def handover(batch: list[Context]) -> list[Any]:
        return [Detached("the receiver took it over"), "kept"]

    first, second = await tm.enqueue_many([{"task_type": "handover"} for _ in range(2)])
    worker = tm.worker(concurrency=2, **OPTIONS)
    await worker.run_until_idle()
    assert worker.held == 0
    detached = await tm.get(first.id)
    assert detached is not None and detached.status is TaskStatus.RUNNING
    assert await tm.attempts(first.id) == []  # the new owner reports it
    kept = await tm.get(second.id)
    assert kept is not None and (kept.status, kept.result) == (TaskStatus.COMPLETED, "kept")


async def test_a_plugin_wrapping_each_call_sees_every_member_of_a_batch(tm: Taskmill):
    started: list[str] = []

    class Started:
        @hookimpl
        def taskmill_task_started(self, task: Any, worker_id: str) -> None:
            started.append(task.id)

    tm.add_plugin(Started(), name="started")
    sizes: list[int] = []

    @tm.handler("seen", batch=BatchOptions(max_size=4, max_wait=5))
    async def seen(batch: list[Context]) -> list[None]:
        sizes.append(len(batch))
        return [None] * len(batch)

    tasks = await tm.enqueue_many([{"task_type": "seen"} for _ in range(4)])
    await tm.worker(concurrency=4, **OPTIONS).run_until_idle()
    assert sizes == [4]
    assert sorted(started) == sorted(t.id for t in tasks)
    assert {await _status(tm, t.id) for t in tasks} == {TaskStatus.COMPLETED}


@pytest.mark.parametrize("backend_url", ["memory"], indirect=True)
async def test_a_finished_batch_leaves_no_reference_cycle_behind(tm: Taskmill):
    """Each member's context is freed as its batch ends, not later by the collector
    (a cycle through the members' cancel callbacks would keep them for a GC pass)."""
    contexts: list[weakref.ref[Context]] = []

    @tm.handler("free", batch=BatchOptions(max_size=10, max_wait=5))
    async def free(batch: list[Context]) -> list[None]:
        contexts.extend(weakref.ref(ctx) for ctx in batch)
        return [None] * len(batch)

    await tm.enqueue_many([{"task_type": "free"} for _ in range(10)])
    gc.collect()
    gc.disable()
    try:
        await tm.worker(concurrency=10, **OPTIONS).run_until_idle()
        assert len(contexts) == 10
        assert [ref() for ref in contexts] == [None] * 10
    finally:
        gc.enable()
