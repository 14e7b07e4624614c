"""Control features through the public API: cancel, suspend, preempt, children,
progress, events, app namespaces, dedupe, retention (SPEC 5.6-5.14)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from datetime import timedelta

import pytest
from taskmill import (
    AttemptOutcome,
    CancelReason,
    Context,
    EventKind,
    InvalidCursor,
    InvalidTaskSpec,
    Priority,
    TaskEvent,
    TaskFilter,
    Taskmill,
    TaskNotFound,
    TaskStatus,
)
from taskmill.testing import wait_until

from tests.test_worker import Background, drain


async def _status_is(tm: Taskmill, task_id: str, status: TaskStatus) -> bool:
    task = await tm.get(task_id)
    return task is not None and task.status is status


async def test_cancelling_a_pending_task_means_it_never_runs(tm: Taskmill):
    ran = []

    @tm.handler("job")
    async def job(ctx: Context, params: dict) -> None:
        ran.append(ctx.task.id)

    doomed = await tm.enqueue("job")
    kept = await tm.enqueue("job")
    cancelled = await tm.cancel(doomed.id)
    assert cancelled.status is TaskStatus.CANCELLED
    assert cancelled.cancel_reason is CancelReason.USER
    await drain(tm)
    assert ran == [kept.id]


async def test_cancel_interrupts_an_async_handler_at_its_next_await(tm: Taskmill):
    started = asyncio.Event()
    interrupted = asyncio.Event()

    @tm.handler("sleepy")
    async def sleepy(ctx: Context, params: dict) -> None:
        started.set()
        try:
            await asyncio.sleep(60)  # never checks ctx.cancelled
        except asyncio.CancelledError:
            interrupted.set()
            raise

    task = await tm.enqueue("sleepy")
    async with Background(tm, cancel_check_interval=0.05):
        await asyncio.wait_for(started.wait(), 5)
        await tm.cancel(task.id)
        # Interrupted long before the handler's own 60 s sleep would have ended.
        await asyncio.wait_for(interrupted.wait(), 5)
    done = await tm.get(task.id)
    assert done is not None and done.status is TaskStatus.CANCELLED
    (attempt,) = await tm.attempts(task.id)
    assert attempt.outcome is AttemptOutcome.CANCELLED


async def test_a_sync_handler_sees_the_cancel_flag(tm: Taskmill):
    started = threading.Event()
    saw = threading.Event()

    @tm.handler("loop")
    def loop(ctx: Context, params: dict) -> None:
        started.set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if ctx.cancelled:
                saw.set()
                ctx.check_cancelled()
            time.sleep(0.01)

    task = await tm.enqueue("loop")
    async with Background(tm, cancel_check_interval=0.05):
        await asyncio.to_thread(started.wait, 5)
        await tm.cancel(task.id)
        assert await asyncio.to_thread(saw.wait, 5)
    assert (await tm.get(task.id)).status is TaskStatus.CANCELLED  # type: ignore[union-attr]


async def test_a_task_cancelled_while_its_handler_returns_stays_cancelled(tm: Taskmill):
    started = threading.Event()
    proceed = threading.Event()

    @tm.handler("stubborn")
    def stubborn(ctx: Context, params: dict) -> str:
        started.set()
        proceed.wait(10)  # ignores the cancel and returns a result anyway
        return "finished"

    task = await tm.enqueue("stubborn")
    async with Background(tm, cancel_check_interval=0.05):
        await asyncio.to_thread(started.wait, 5)
        await tm.cancel(task.id)
        proceed.set()
        await wait_until(lambda: _no_running(tm))
    done = await tm.get(task.id)
    assert done is not None
    assert done.status is TaskStatus.CANCELLED
    assert done.result is None


async def _no_running(tm: Taskmill) -> bool:
    summary = await tm.progress_summary()
    return summary.running == 0


async def test_cancel_cascades_to_children_spawned_and_batched(tm: Taskmill):
    gate = asyncio.Event()

    @tm.handler("parent")
    async def parent(ctx: Context, params: dict) -> None:
        await ctx.spawn("child", {"n": 1})
        await gate.wait()

    @tm.handler("child")
    async def child(ctx: Context, params: dict) -> None:
        await gate.wait()

    root = await tm.enqueue("parent", app_id="media")
    batch = await tm.batch_children(
        root.id, [{"task_type": "child", "params": {"n": i}} for i in range(2)]
    )
    assert all(c.parent_id == root.id and c.app_id == "media" for c in batch)
    async with Background(
        tm, cancel_check_interval=0.05, concurrency=2, reserved_high_priority_slots=0
    ):
        await wait_until(lambda: _children_count(tm, root.id, 3))
        spawned = await tm.query(TaskFilter(parent_id=root.id))
        assert {t.app_id for t in spawned} == {"media"}
        await tm.cancel(root.id)
        await wait_until(lambda: _no_running(tm))
    summary = await tm.progress_summary(TaskFilter(parent_id=root.id))
    assert (summary.total, summary.cancelled) == (3, 3)
    gate.set()


async def _children_count(tm: Taskmill, parent_id: str, n: int) -> bool:
    return (await tm.progress_summary(TaskFilter(parent_id=parent_id))).total == n


async def test_ctx_spawn_works_from_a_sync_handler(tm: Taskmill):
    @tm.handler("fan-out")
    def fan_out(ctx: Context, params: dict) -> list[str]:
        return [ctx.spawn("leaf", {"i": i}).result().id for i in range(3)]

    @tm.handler("leaf")
    async def leaf(ctx: Context, params: dict) -> int:
        return int(params["i"])

    root = await tm.enqueue("fan-out")
    await drain(tm)
    done = await tm.get(root.id)
    assert done is not None and len(done.result) == 3
    children = await tm.query(TaskFilter(parent_id=root.id))
    assert sorted(t.result for t in children) == [0, 1, 2]


async def test_suspension_requeues_running_tasks_and_holds_new_claims(tm: Taskmill):
    started = asyncio.Event()
    finished = []

    @tm.handler("encode")
    async def encode(ctx: Context, params: dict) -> None:
        started.set()
        for _ in range(100):
            ctx.check_cancelled()
            await asyncio.sleep(0.02)
        finished.append(ctx.task.id)

    @tm.handler("other")
    async def other(ctx: Context, params: dict) -> str:
        return "ran"

    task = await tm.enqueue("encode")
    async with Background(tm, cancel_check_interval=0.05):
        await asyncio.wait_for(started.wait(), 5)
        assert await tm.suspend("encode") == 1
        await wait_until(lambda: _status_is(tm, task.id, TaskStatus.PENDING))
        back = await tm.get(task.id)
        assert back is not None and back.attempts == 0
        free = await tm.enqueue("other")
        assert (await tm.wait(free.id, timeout=5)).result == "ran"
        assert (await tm.get(task.id)).status is TaskStatus.PENDING  # type: ignore[union-attr]
        assert [s.task_type for s in await tm.suspensions()] == ["encode"]
        assert await tm.resume("encode") is True
        done = await tm.wait(task.id, timeout=10)
    assert done.status is TaskStatus.COMPLETED
    assert finished == [task.id]
    assert [a.outcome for a in await tm.attempts(task.id)] == [
        AttemptOutcome.INTERRUPTED,
        AttemptOutcome.COMPLETED,
    ]


async def test_preempt_cancels_the_active_tasks_of_a_scope(tm: Taskmill):
    await tm.enqueue_many([{"task_type": "search", "params": {"q": q}} for q in "abc"])
    await tm.enqueue("search", app_id="other")
    await tm.enqueue("index")
    keyed = await tm.enqueue("search", dedupe_key="user-1", app_id="x")
    assert await tm.preempt("search", app_id="x", dedupe_key="user-1") == 1
    assert (await tm.get(keyed.id)).cancel_reason is CancelReason.PREEMPTED  # type: ignore[union-attr]
    assert await tm.preempt("search") == 4
    summary = await tm.progress_summary()
    assert (summary.cancelled, summary.pending) == (5, 1)


async def test_cancel_by_filter_counts_what_changed(tm: Taskmill):
    await tm.enqueue_many([{"task_type": "a", "user_id": "u1"}] * 3)
    await tm.enqueue("a", user_id="u2")
    assert await tm.cancel_by_filter(TaskFilter(user_id="u1")) == 3
    assert await tm.cancel_by_filter(TaskFilter(user_id="u1")) == 0


async def test_progress_is_coalesced_and_the_last_value_stored(tm: Taskmill):
    @tm.handler("tight")
    async def tight(ctx: Context, params: dict) -> None:
        for i in range(10_000):
            await ctx.progress(i + 1, 10_000, f"item {i + 1}")
            if i % 1000 == 0:
                await asyncio.sleep(0.05)

    _, start = await tm.storage.read_events(None)
    task = await tm.enqueue("tight")
    await drain(tm, progress_interval=0.1)
    done = await tm.get(task.id)
    assert done is not None
    assert done.progress.done == 10_000 and done.progress.message == "item 10000"
    events, _ = await tm.storage.read_events(start, limit=100_000)
    progress_events = [e for e in events if e.kind is EventKind.PROGRESS]
    # Coalesced: writes are spaced by progress_interval (as the store stamped them, with
    # room for write latency), not one per call.
    assert 1 <= len(progress_events) < 10_000
    stamps = [e.at for e in progress_events]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)]
    assert all(gap >= 0.05 for gap in gaps), gaps


async def test_events_stream_every_change_in_order(tm: Taskmill):
    @tm.handler("job")
    async def job(ctx: Context, params: dict) -> str:
        await ctx.progress(1, 1)

        async def progress_saved() -> bool:  # by the worker's coalesced write
            current = await tm.get(ctx.task.id)
            return current is not None and current.progress.done == 1

        await wait_until(progress_saved)
        return "ok"

    seen: list[TaskEvent] = []

    async def subscribe(ready: asyncio.Event) -> None:
        stream = await tm.subscribe(TaskFilter(task_types=("job",)))
        ready.set()
        async for event in stream:
            seen.append(event)
            if event.status.terminal:
                return

    ready = asyncio.Event()
    listener = asyncio.create_task(subscribe(ready))
    await ready.wait()
    task = await tm.enqueue("job")
    await tm.enqueue("not-job")
    await drain(tm, progress_interval=0.2)
    await asyncio.wait_for(listener, 10)
    assert all(e.task.id == task.id for e in seen)
    assert [e.kind for e in seen] == [
        EventKind.ENQUEUED,
        EventKind.STARTED,
        EventKind.PROGRESS,
        EventKind.COMPLETED,
    ]


async def test_events_resume_after_a_cursor_and_refuse_one_the_store_did_not_write(
    tm: Taskmill,
):
    stream = await tm.subscribe()
    first = await tm.enqueue("job")
    async with asyncio.timeout(10):
        seen = await anext(stream)
    await stream.aclose()  # type: ignore[attr-defined]
    assert seen.task.id == first.id
    second = await tm.enqueue("job")
    resumed = tm.events(since=seen.cursor)
    async with asyncio.timeout(10):
        after = await anext(resumed)
    await resumed.aclose()  # type: ignore[attr-defined]
    assert after.task.id == second.id and seen.cursor < after.cursor
    for foreign in ("", "not-a-cursor", f"{seen.cursor}.0"):
        refused = tm.events(since=foreign)
        with pytest.raises(InvalidCursor, match=r"TaskEvent\.cursor"):
            await anext(refused)


async def test_for_app_stamps_and_isolates(tm: Taskmill):
    photos = tm.for_app("photos")
    docs = tm.for_app("docs")
    mine = await photos.enqueue("thumb", {"p": 1})
    theirs = await docs.enqueue("thumb", {"p": 2})
    assert mine.app_id == "photos"
    assert await photos.get(theirs.id) is None
    assert [t.id for t in await photos.query()] == [mine.id]
    assert (await photos.progress_summary()).total == 1
    assert await photos.attempts(theirs.id) == []
    for operation in (photos.cancel, photos.retry, photos.wait):
        with pytest.raises(TaskNotFound):
            await operation(theirs.id)
    with pytest.raises(TaskNotFound):
        await photos.batch_children(theirs.id, [{"task_type": "x"}])
    with pytest.raises(InvalidTaskSpec, match="bound to app 'photos'"):
        await photos.enqueue("thumb", app_id="docs")
    with pytest.raises(InvalidTaskSpec, match="cannot select tasks of app 'docs'"):
        await photos.cancel_by_filter(TaskFilter(app_id="docs"))
    with pytest.raises(InvalidTaskSpec):
        await photos.query(TaskFilter(app_id="docs"))
    assert await photos.cancel_by_filter(TaskFilter(statuses=[TaskStatus.RUNNING])) == 0
    assert (await tm.get(mine.id)).status is TaskStatus.PENDING  # type: ignore[union-attr]
    assert await photos.cancel_by_filter(TaskFilter()) == 1  # its own only
    assert (await tm.get(theirs.id)).status is TaskStatus.PENDING  # type: ignore[union-attr]
    assert await photos.preempt("thumb") == 0
    await photos.suspend("thumb")
    assert [(s.task_type, s.app_id) for s in await tm.suspensions()] == [("thumb", "photos")]


async def test_dedupe_aliases_take_the_leaders_result(tm: Taskmill):
    runs = 0

    @tm.handler("render")
    async def render(ctx: Context, params: dict) -> dict:
        nonlocal runs
        runs += 1
        return {"page": params["page"]}

    leader = await tm.enqueue("render", {"page": 1}, dedupe_key="page-1")
    aliases = [await tm.enqueue("render", {"page": 1}, dedupe_key="page-1") for _ in range(3)]
    assert all(a.alias_of == leader.id for a in aliases)
    await drain(tm)
    assert runs == 1
    for alias in aliases:
        done = await tm.get(alias.id)
        assert done is not None and done.result == {"page": 1}


async def test_a_worker_can_clean_up_periodically(tm: Taskmill):
    @tm.handler("job")
    async def job(ctx: Context, params: dict) -> None:
        return None

    await tm.enqueue_many([{"task_type": "job"}] * 3)
    failed = await tm.enqueue("job", priority=Priority.URGENT)
    await tm.cancel(failed.id)
    async with Background(
        tm, cleanup_older_than=timedelta(0), cleanup_interval=0.05, rescue_interval=0.05
    ):
        await wait_until(lambda: _total_is(tm, 0))


async def _total_is(tm: Taskmill, n: int) -> bool:
    return (await tm.progress_summary()).total == n
