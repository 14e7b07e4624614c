"""The worker and the task API, end to end, on every in-process-testable backend."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from taskmill import (
    AttemptOutcome,
    Context,
    Detached,
    Fail,
    HandlerConflict,
    InvalidTaskSpec,
    InvalidTransition,
    Priority,
    Retry,
    RetryPolicy,
    TaskFilter,
    Taskmill,
    TaskNotFound,
    TaskStatus,
    WaitTimeout,
)
from taskmill.storage import Finish, FinishKind, Lease, utcnow
from taskmill.testing import wait_until

FAST_RETRY = RetryPolicy(base=0.01, maximum=0.05, jitter=0.0)


def worker_options(**overrides):
    options = {
        "handle_signals": False,
        "retry_policy": FAST_RETRY,
        "min_poll_interval": 0.01,
        "poll_interval": 0.05,
    }
    options.update(overrides)
    return options


async def drain(tm: Taskmill, **options) -> None:
    await tm.run_worker(until_idle=True, **worker_options(**options))


class Background:
    """Runs ``worker.run()`` in the background for the duration of a test."""

    def __init__(self, tm: Taskmill, **options) -> None:
        self.worker = tm.worker(**worker_options(**options))
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self):
        self.task = asyncio.create_task(self.worker.run())
        return self.worker

    async def __aexit__(self, *exc_info) -> None:
        await self.worker.stop(grace=5)
        assert self.task is not None
        await asyncio.wait_for(self.task, 10)


async def test_async_handler_runs_and_stores_its_result_and_progress(tm: Taskmill):
    @tm.handler("resize")
    async def resize(ctx: Context, params: dict) -> dict:
        for i, _ in enumerate(params["items"]):
            ctx.check_cancelled()
            await ctx.progress(i + 1, len(params["items"]), f"item {i + 1}")
        await ctx.set_data(seen=len(params["items"]))
        return {"ok": True}

    task = await tm.enqueue("resize", {"items": [1, 2, 3]}, priority=Priority.USER_ACTION)
    await drain(tm, concurrency=8)
    done = await tm.get(task.id)
    assert done is not None
    assert done.status is TaskStatus.COMPLETED
    assert done.result == {"ok": True}
    assert done.progress.done == 3 and done.progress.pct == 100
    assert done.progress.message == "item 3"
    assert done.data == {"seen": 3}
    assert done.attempts == 1


async def test_sync_handler_runs_in_a_thread_and_ctx_works_there(tm: Taskmill):
    threads: list[str] = []

    @tm.handler("sync")
    def sync(ctx: Context, params: dict) -> int:
        threads.append(threading.current_thread().name)
        ctx.progress(1, 2, "half")
        ctx.set_data(where="thread")
        ctx.check_cancelled()
        return params["n"] * 2

    task = await tm.enqueue("sync", {"n": 21})
    await drain(tm)
    done = await tm.get(task.id)
    assert done is not None and done.result == 42
    assert done.progress.message == "half" and done.data == {"where": "thread"}
    assert threads and threads[0] != threading.main_thread().name


async def test_failures_are_retried_with_backoff_then_succeed(tm: Taskmill):
    calls = []

    @tm.handler("flaky", max_retries=3)
    async def flaky(ctx: Context, params: dict) -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise RuntimeError(f"boom {len(calls)}")
        return "ok"

    task = await tm.enqueue("flaky")
    await drain(tm, retry_policy=RetryPolicy(base=0.1, maximum=1, jitter=0))
    done = await tm.get(task.id)
    assert done is not None and done.status is TaskStatus.COMPLETED
    assert done.attempts == 3
    assert calls[1] - calls[0] >= 0.09  # first backoff: base
    assert calls[2] - calls[1] >= 0.19  # doubled
    log = await tm.attempts(task.id)
    assert [a.outcome for a in log] == [
        AttemptOutcome.FAILED,
        AttemptOutcome.FAILED,
        AttemptOutcome.COMPLETED,
    ]
    assert (log[0].error or "").split("\n")[0] == "RuntimeError: boom 1"


async def test_retries_are_bounded_and_failed_is_the_dead_letter(tm: Taskmill):
    calls = 0

    @tm.handler("broken", max_retries=2)
    async def broken(ctx: Context, params: dict) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("always")

    task = await tm.enqueue("broken")
    await drain(tm)
    dead = await tm.get(task.id)
    assert dead is not None and dead.status is TaskStatus.FAILED
    assert calls == 3 == dead.attempts
    assert dead.error is not None and "ValueError: always" in dead.error
    assert len(await tm.attempts(task.id)) == 3


async def test_retry_redrives_a_dead_letter(tm: Taskmill):
    fixed = False

    @tm.handler("needs-fix", max_retries=0)
    async def needs_fix(ctx: Context, params: dict) -> str:
        if not fixed:
            raise RuntimeError("not yet")
        return "fixed"

    task = await tm.enqueue("needs-fix")
    await drain(tm)
    assert (await tm.wait(task.id, timeout=5)).status is TaskStatus.FAILED
    fixed = True
    redriven = await tm.retry(task.id)
    assert redriven.status is TaskStatus.PENDING and redriven.attempts == 0
    await drain(tm)
    done = await tm.get(task.id)
    assert done is not None and done.status is TaskStatus.COMPLETED
    assert [a.outcome for a in await tm.attempts(task.id)] == [
        AttemptOutcome.FAILED,
        AttemptOutcome.COMPLETED,
    ]
    with pytest.raises(InvalidTransition):
        await tm.retry(task.id)


async def test_fail_skips_the_remaining_retries(tm: Taskmill):
    @tm.handler("validate", max_retries=5)
    async def validate(ctx: Context, params: dict) -> None:
        raise Fail("input is not an image")

    task = await tm.enqueue("validate")
    await drain(tm)
    done = await tm.get(task.id)
    assert done is not None and done.status is TaskStatus.FAILED
    assert done.attempts == 1 and done.error == "input is not an image"


async def test_retry_exception_asks_for_a_specific_delay(tm: Taskmill):
    runs: list[float] = []

    @tm.handler("later")
    async def later(ctx: Context, params: dict) -> int:
        runs.append(time.monotonic())
        if len(runs) == 1:
            raise Retry(delay=0.3)
        return len(runs)

    task = await tm.enqueue("later")
    await drain(tm)
    assert (await tm.wait(task.id, timeout=5)).result == 2
    assert runs[1] - runs[0] >= 0.29


async def test_timeout_counts_as_an_attempt(tm: Taskmill):
    @tm.handler("slow", timeout=0.1, max_retries=1)
    async def slow(ctx: Context, params: dict) -> None:
        await asyncio.sleep(30)

    task = await tm.enqueue("slow")
    await drain(tm)
    done = await tm.get(task.id)
    assert done is not None and done.status is TaskStatus.FAILED
    assert done.attempts == 2
    assert [a.outcome for a in await tm.attempts(task.id)] == [AttemptOutcome.TIMED_OUT] * 2
    assert done.error is not None and "timed out after 0.1 s" in done.error


async def test_sync_handler_timeout(tm: Taskmill):
    release = threading.Event()

    @tm.handler("stuck", timeout=0.1, max_retries=0)
    def stuck(ctx: Context, params: dict) -> None:
        release.wait(5)

    task = await tm.enqueue("stuck")
    try:
        await drain(tm)
    finally:
        release.set()
    done = await tm.get(task.id)
    assert done is not None and done.status is TaskStatus.FAILED
    assert (await tm.attempts(task.id))[0].outcome is AttemptOutcome.TIMED_OUT


async def test_a_result_that_is_not_json_fails_the_task(tm: Taskmill):
    @tm.handler("bad-result")
    async def bad_result(ctx: Context, params: dict) -> object:
        return {"when": object()}

    task = await tm.enqueue("bad-result")
    await drain(tm)
    done = await tm.get(task.id)
    assert done is not None and done.status is TaskStatus.FAILED
    assert done.error is not None and "not JSON-serializable" in done.error


async def test_higher_priority_runs_first(tm: Taskmill):
    order: list[str] = []

    @tm.handler("job")
    async def job(ctx: Context, params: dict) -> None:
        order.append(params["name"])

    await tm.enqueue("job", {"name": "background"}, priority=Priority.BACKGROUND)
    await tm.enqueue("job", {"name": "normal-1"})
    await tm.enqueue("job", {"name": "urgent"}, priority=Priority.URGENT)
    await tm.enqueue("job", {"name": "normal-2"})
    await tm.enqueue("job", {"name": "user"}, priority=Priority.USER_ACTION)
    await drain(tm, concurrency=1)
    assert order == ["urgent", "user", "normal-1", "normal-2", "background"]


async def test_reserved_slot_lets_a_high_priority_task_start_while_normal_work_fills_the_rest(
    tm: Taskmill,
):
    gate = asyncio.Event()
    started: list[str] = []

    @tm.handler("job")
    async def job(ctx: Context, params: dict) -> None:
        started.append(params["name"])
        if params["name"] != "vip":
            await gate.wait()

    for i in range(4):
        await tm.enqueue("job", {"name": f"n{i}"})
    async with Background(tm, concurrency=3, reserved_high_priority_slots=1) as worker:
        await wait_until(lambda: _true(worker.running == 2))
        await asyncio.sleep(0.1)  # give the worker a chance to (wrongly) start a third
        assert sorted(started) == ["n0", "n1"]
        vip = await tm.enqueue("job", {"name": "vip"}, priority=Priority.USER_ACTION)
        done = await tm.wait(vip.id, timeout=5)
        assert done.status is TaskStatus.COMPLETED
        assert len(started) == 3
        gate.set()
        await wait_until(lambda: _completed(tm, 5))


async def _completed(tm: Taskmill, n: int) -> bool:
    return (await tm.progress_summary()).completed == n


async def _true(value: bool) -> bool:
    return value


async def test_handler_concurrency_caps_a_task_type(tm: Taskmill):
    active = 0
    peak = 0

    @tm.handler("capped", concurrency=2)
    async def capped(ctx: Context, params: dict) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.02)
        active -= 1

    @tm.handler("free")
    async def free(ctx: Context, params: dict) -> None:
        await asyncio.sleep(0.02)

    await tm.enqueue_many([{"task_type": "capped"}] * 10 + [{"task_type": "free"}] * 10)
    await drain(tm, concurrency=8)
    assert peak == 2
    assert (await tm.progress_summary()).completed == 20


async def test_concurrency_bounds_running_handlers(tm: Taskmill):
    active = 0
    peak = 0
    full = asyncio.Event()  # set once every slot was busy at one moment

    @tm.handler("job")
    async def job(ctx: Context, params: dict) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        if active == 4:
            full.set()
        # Hold the first handlers until the worker filled every slot (a slow store
        # claims the rest later), so reaching the bound does not depend on timing.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await full.wait()
        await asyncio.sleep(0.01)
        active -= 1

    await tm.enqueue_many([{"task_type": "job", "priority": p} for p in (100, 1000) * 20])
    await drain(tm, concurrency=4, reserved_high_priority_slots=1)
    assert peak == 4


async def test_a_task_without_a_handler_stays_pending_and_visible(tm: Taskmill):
    @tm.handler("known")
    async def known(ctx: Context, params: dict) -> None:
        return None

    orphan = await tm.enqueue("unknown-type", {"x": 1})
    await tm.enqueue("known")
    await drain(tm)
    still = await tm.get(orphan.id)
    assert still is not None and still.status is TaskStatus.PENDING
    pending = await tm.query(TaskFilter(statuses=[TaskStatus.PENDING]))
    assert [t.id for t in pending] == [orphan.id]


async def test_delay_and_run_at_hold_a_task_back(tm: Taskmill):
    ran: list[float] = []

    @tm.handler("job")
    async def job(ctx: Context, params: dict) -> None:
        ran.append(time.monotonic())

    start = time.monotonic()
    soon = await tm.enqueue("job", delay=0.3)
    far = await tm.enqueue("job", delay=timedelta(hours=1))
    await drain(tm)
    assert (await tm.get(soon.id)).status is TaskStatus.COMPLETED  # type: ignore[union-attr]
    assert ran[0] - start >= 0.29
    assert (await tm.get(far.id)).status is TaskStatus.PENDING  # type: ignore[union-attr]


async def test_tick_runs_one_batch(tm: Taskmill):
    @tm.handler("job")
    async def job(ctx: Context, params: dict) -> int:
        return params["i"]

    await tm.enqueue_many([{"task_type": "job", "params": {"i": i}} for i in range(5)])
    worker = tm.worker(**worker_options(concurrency=3, reserved_high_priority_slots=0))
    assert await worker.tick() == 3
    assert (await tm.progress_summary()).completed == 3
    assert await worker.tick() == 2
    assert await worker.tick() == 0
    assert (await tm.progress_summary()).completed == 5


async def test_leases_are_renewed_while_a_long_handler_runs(tm: Taskmill):
    runs = 0

    @tm.handler("long")
    async def long(ctx: Context, params: dict) -> str:
        nonlocal runs
        runs += 1
        await asyncio.sleep(1.0)
        return "done"

    task = await tm.enqueue("long")
    await drain(tm, lease_seconds=0.3, rescue_interval=0.05)
    done = await tm.get(task.id)
    assert done is not None and done.status is TaskStatus.COMPLETED
    assert runs == 1 and done.attempts == 1


async def test_stop_with_grace_requeues_running_tasks_without_spending_an_attempt(
    tm: Taskmill,
):
    started = asyncio.Event()

    @tm.handler("forever")
    async def forever(ctx: Context, params: dict) -> None:
        started.set()
        await asyncio.sleep(60)

    task = await tm.enqueue("forever")
    worker = tm.worker(**worker_options())
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 5)
    await worker.stop(grace=0.1)
    await asyncio.wait_for(running, 5)
    back = await tm.get(task.id)
    assert back is not None and back.status is TaskStatus.PENDING
    assert back.attempts == 0 and back.worker_id is None
    (log,) = await tm.attempts(task.id)
    assert log.outcome is AttemptOutcome.INTERRUPTED


async def test_stop_lets_tasks_finish_within_the_grace_period(tm: Taskmill):
    started = asyncio.Event()

    @tm.handler("short")
    async def short(ctx: Context, params: dict) -> str:
        started.set()
        await asyncio.sleep(0.2)
        return "finished"

    task = await tm.enqueue("short")
    worker = tm.worker(**worker_options())
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 5)
    await worker.stop(grace=5)
    await asyncio.wait_for(running, 5)
    assert (await tm.get(task.id)).result == "finished"  # type: ignore[union-attr]


async def test_a_running_worker_wakes_up_for_tasks_enqueued_in_process(tm: Taskmill):
    @tm.handler("job")
    async def job(ctx: Context, params: dict) -> str:
        return "ran"

    async with Background(tm, poll_interval=30, min_poll_interval=30):
        await asyncio.sleep(0.05)  # the worker is idle and would poll only in 30 s
        task = await tm.enqueue("job")
        done = await tm.wait(task.id, timeout=5)
    assert done.result == "ran"


async def test_wait_times_out_and_reports_unknown_ids(tm: Taskmill):
    task = await tm.enqueue("nobody-handles-this")
    with pytest.raises(WaitTimeout, match="still pending"):
        await tm.wait(task.id, timeout=0.05)
    with pytest.raises(TaskNotFound):
        await tm.wait("no-such-id", timeout=0.05)


async def test_registering_a_type_twice_is_a_conflict(tm: Taskmill):
    async def a(ctx: Context, params: dict) -> None:
        return None

    tm.register("dup", a)
    with pytest.raises(HandlerConflict, match="registered twice"):
        tm.register("dup", a)
    tm.register("dup", a, app_id="other-app")  # another app's key is fine


async def test_app_handler_is_preferred_over_the_host_handler(tm: Taskmill):
    @tm.handler("thumb")
    async def host(ctx: Context, params: dict) -> str:
        return "host"

    @tm.handler("thumb", app_id="photos")
    async def photos(ctx: Context, params: dict) -> str:
        return "photos"

    mine = await tm.enqueue("thumb", app_id="photos")
    theirs = await tm.enqueue("thumb", app_id="docs")
    await drain(tm)
    assert (await tm.get(mine.id)).result == "photos"  # type: ignore[union-attr]
    assert (await tm.get(theirs.id)).result == "host"  # type: ignore[union-attr]


async def test_max_retries_comes_from_the_enqueue_then_the_handler_then_the_default(
    tm: Taskmill,
):
    @tm.handler("h", max_retries=7)
    async def h(ctx: Context, params: dict) -> None:
        return None

    assert (await tm.enqueue("h")).max_retries == 7
    assert (await tm.enqueue("h", max_retries=1)).max_retries == 1
    assert (await tm.enqueue("other")).max_retries == 3


async def test_enqueue_many_accepts_dicts_and_specs_in_one_call(tm: Taskmill):
    from taskmill import TaskSpec

    tasks = await tm.enqueue_many(
        [
            {"task_type": "a", "params": {"i": 1}, "priority": 1000},
            TaskSpec(task_type="b", params={"i": 2}),
        ]
    )
    assert [(t.task_type, t.priority) for t in tasks] == [("a", 1000), ("b", 100)]
    with pytest.raises(InvalidTaskSpec, match="unknown task spec field"):
        await tm.enqueue_many([{"task_type": "a", "colour": "red"}])


async def test_cleanup_removes_finished_tasks(tm: Taskmill):
    @tm.handler("job")
    async def job(ctx: Context, params: dict) -> None:
        return None

    await tm.enqueue_many([{"task_type": "job"}] * 3)
    keep = await tm.enqueue("nobody")
    await drain(tm)
    # cleanup(0) takes what finished strictly before now: wait for the clock to move.
    assert await wait_until(lambda: tm.cleanup(timedelta(0))) == 3
    assert [t.id for t in await tm.query()] == [keep.id]


async def test_an_app_handlers_cap_holds_when_a_host_handler_exists(tm: Taskmill):
    active = 0
    peak = 0

    @tm.handler("t")
    async def host(ctx: Context, params: dict) -> None:
        return None

    @tm.handler("t", app_id="a", concurrency=1)
    async def app_handler(ctx: Context, params: dict) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.02)
        active -= 1

    await tm.enqueue_many([{"task_type": "t", "app_id": "a"}] * 6)
    await drain(tm, concurrency=6)
    assert peak == 1
    assert (await tm.progress_summary()).completed == 6


async def test_a_timed_out_sync_handler_does_not_starve_the_next_task(tm: Taskmill):
    saw_cancel = threading.Event()

    @tm.handler("stuck", timeout=0.1, max_retries=0)
    def stuck(ctx: Context, params: dict) -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if ctx.cancelled:
                saw_cancel.set()
                return
            time.sleep(0.01)

    @tm.handler("next")
    def next_task(ctx: Context, params: dict) -> str:
        return "ran"

    first = await tm.enqueue("stuck", priority=Priority.URGENT)
    second = await tm.enqueue("next")
    await drain(tm, concurrency=1)
    assert (await tm.get(first.id)).status is TaskStatus.FAILED  # type: ignore[union-attr]
    assert (await tm.get(second.id)).result == "ran"  # type: ignore[union-attr]
    assert saw_cancel.wait(5), "the timed-out handler saw ctx.cancelled"


async def test_a_handler_raising_cancelled_error_itself_does_not_wedge_the_worker(
    tm: Taskmill,
):
    @tm.handler("weird", max_retries=0)
    async def weird(ctx: Context, params: dict) -> None:
        raise asyncio.CancelledError

    task = await tm.enqueue("weird")
    await asyncio.wait_for(drain(tm), 10)
    done = await tm.get(task.id)
    assert done is not None and done.status.terminal


async def test_an_interrupted_handler_that_raises_another_error_spends_no_attempt(
    tm: Taskmill,
):
    started = asyncio.Event()

    @tm.handler("messy")
    async def messy(ctx: Context, params: dict) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    task = await tm.enqueue("messy")
    worker = tm.worker(**worker_options())
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 5)
    await worker.stop(grace=0.05)
    await asyncio.wait_for(running, 5)
    back = await tm.get(task.id)
    assert back is not None and back.status is TaskStatus.PENDING
    assert back.attempts == 0


# -- detached attempts (a handler that hands its attempt over) ----------------------------


async def wait_for(condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds (a worker's counters, say); fail after 10 s."""

    async def probe() -> bool:
        return condition()

    await wait_until(probe)


async def test_a_detached_attempt_frees_its_slot_and_its_owner_finishes_it_under_the_lease(
    tm: Taskmill,
):
    @tm.handler("handoff")
    async def handoff(ctx: Context, params: dict) -> None:
        raise Detached("the receiver took it over")

    @tm.handler("next")
    async def next_task(ctx: Context, params: dict) -> str:
        return "ran"

    handed = await tm.enqueue("handoff", priority=Priority.USER_ACTION)
    following = await tm.enqueue("next")
    # One slot: the second task can run only once the first attempt gave its slot up.
    async with Background(tm, concurrency=1, reserved_high_priority_slots=0) as worker:
        ran = await tm.wait(following.id, timeout=10)
        assert ran.status is TaskStatus.COMPLETED
        await wait_for(lambda: worker.running == 0 and worker.held == 0)
        assert worker.detached == 1 and worker.processed == 1
        running = await tm.get(handed.id)
        assert running is not None and running.status is TaskStatus.RUNNING
        assert running.worker_id == worker.worker_id and running.attempts == 1
        assert await tm.attempts(handed.id) == []  # the worker wrote no outcome

        # The new owner holds the attempt's lease: it renews it and ends the attempt.
        lease = Lease(task_id=handed.id, worker_id=worker.worker_id, attempt=1)
        assert await tm.storage.renew_leases([lease], 30.0) == {handed.id: None}
        assert running.started_at is not None
        (done,) = await tm.storage.finish_batch(
            [
                Finish(
                    lease=lease,
                    kind=FinishKind.COMPLETE,
                    outcome=AttemptOutcome.COMPLETED,
                    started_at=running.started_at,
                    finished_at=utcnow(),
                    result_json='{"by": "owner"}',
                )
            ]
        )
    assert done is not None and done.status is TaskStatus.COMPLETED
    assert done.result == {"by": "owner"}
    (attempt,) = await tm.attempts(handed.id)
    assert attempt.outcome is AttemptOutcome.COMPLETED and attempt.worker_id == worker.worker_id


async def test_a_detached_attempt_is_not_renewed_and_is_rescued_when_its_owner_goes_silent(
    tm: Taskmill,
):
    @tm.handler("handoff", max_retries=0)
    async def handoff(ctx: Context, params: dict) -> None:
        raise Detached("the receiver took it over")

    task = await tm.enqueue("handoff")
    # Leases renewed every 0.1 s would keep a held attempt alive forever: this one
    # expires because the worker stopped renewing it, and the worker rescues it.
    async with Background(tm, lease_seconds=0.3, rescue_interval=0.05) as worker:
        rescued = await tm.wait(task.id, timeout=10)
    assert rescued.status is TaskStatus.FAILED and "lease expired" in (rescued.error or "")
    assert [a.outcome for a in await tm.attempts(task.id)] == [AttemptOutcome.LOST]
    assert worker.detached == 1 and worker.processed == 0


async def test_a_worker_stopping_leaves_a_detached_attempt_to_its_owner(tm: Taskmill):
    @tm.handler("handoff")
    def handoff(ctx: Context, params: dict) -> None:  # a plain def hands over the same way
        raise Detached("the receiver took it over")

    task = await tm.enqueue("handoff")
    async with Background(tm) as worker:
        await wait_for(lambda: worker.detached == 1)
    after = await tm.get(task.id)
    # No SHUTDOWN release: the attempt is the owner's, not the worker's, to give back.
    assert after is not None and after.status is TaskStatus.RUNNING and after.attempts == 1
    assert await tm.attempts(task.id) == []


async def test_a_detached_attempt_no_longer_counts_against_its_handlers_cap(tm: Taskmill):
    @tm.handler("handoff", concurrency=1)
    async def handoff(ctx: Context, params: dict) -> None:
        raise Detached("the receiver took it over")

    tasks = await tm.enqueue_many([{"task_type": "handoff"} for _ in range(3)])
    async with Background(tm, concurrency=4, reserved_high_priority_slots=0) as worker:
        # One at a time by the cap, yet all three are handed over: each frees its room.
        await wait_for(lambda: worker.detached == 3)
        assert worker.held == 0
    running = [await tm.get(t.id) for t in tasks]
    assert all(t is not None and t.status is TaskStatus.RUNNING for t in running)


async def test_a_retry_delay_that_is_not_a_finite_number_fails_the_attempt_clearly(tm: Taskmill):
    @tm.handler("never-due", max_retries=1)
    async def never(ctx: Context, params: dict) -> None:
        raise Retry(delay=float(params["delay"]))

    infinite = await tm.enqueue("never-due", {"delay": "inf"})
    negative = await tm.enqueue("never-due", {"delay": -1})
    await drain(tm)
    for task in (infinite, negative):
        done = await tm.get(task.id)
        assert done is not None and done.status is TaskStatus.FAILED
        assert done.attempts == 2
        assert done.error is not None
        assert "Retry(delay=...) takes a finite number of seconds from 0 to" in done.error
