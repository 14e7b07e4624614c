"""The lifecycle and handler hooks, fired by real workers on every in-process backend:
once per event, with the outcome the execution log records. Plugins here are objects
added in code (``tm.add_plugin``); test_plugins.py covers installed ones."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from taskmill import (
    AttemptOutcome,
    Cancelled,
    CancelReason,
    Context,
    Detached,
    Fail,
    Task,
    Taskmill,
    TaskStatus,
    Worker,
    hookimpl,
)
from taskmill.storage import ClaimRequest, utcnow
from taskmill.testing import wait_until

from tests.test_worker import Background, drain, worker_options

OK = AttemptOutcome.COMPLETED
FAILED = AttemptOutcome.FAILED


class Recorder:
    """Records every lifecycle hook call as a tuple."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.errors: list[str] = []
        """Every error a hook received, whole (``calls`` keeps their first lines)."""

    def _error(self, error: str | None) -> str | None:
        if error is None:
            return None
        self.errors.append(error)
        return error.split("\n", 1)[0]

    def of(self, task: Task) -> list[tuple[Any, ...]]:
        """The calls about ``task``, without its id."""
        return [(c[0], *c[2:]) for c in self.calls if len(c) > 1 and c[1] == task.id]

    def named(self, hook: str) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == hook]

    @hookimpl
    def taskmill_task_enqueued(self, task: Task) -> None:
        self.calls.append(("enqueued", task.id, task.status))

    @hookimpl
    def taskmill_task_started(self, task: Task, worker_id: str) -> None:
        assert task.status is TaskStatus.RUNNING and task.worker_id == worker_id
        self.calls.append(("started", task.id, task.attempts))

    @hookimpl
    def taskmill_task_finished(
        self, task: Task, outcome: AttemptOutcome, elapsed_ms: float, error: str | None
    ) -> None:
        assert elapsed_ms >= 0
        self.calls.append(("finished", task.id, outcome, task.status, self._error(error)))

    @hookimpl
    def taskmill_task_detached(self, task: Task, worker_id: str) -> None:
        assert task.status is TaskStatus.RUNNING and task.worker_id == worker_id
        self.calls.append(("detached", task.id, task.attempts))

    @hookimpl
    def taskmill_task_retried(self, task: Task, error: str | None, delay: float) -> None:
        assert delay >= 0
        self.calls.append(("retried", task.id, task.attempts, self._error(error)))

    @hookimpl
    def taskmill_task_dead_lettered(self, task: Task, error: str | None) -> None:
        self.calls.append(("dead_lettered", task.id, task.status, self._error(error)))

    @hookimpl
    def taskmill_task_cancelled(self, task: Task, reason: CancelReason) -> None:
        self.calls.append(("cancelled", task.id, task.status, reason))

    @hookimpl
    def taskmill_worker_started(self, worker: Worker) -> None:
        self.calls.append(("worker_started", worker.worker_id, worker.processed))

    @hookimpl
    def taskmill_worker_stopped(self, worker: Worker) -> None:
        self.calls.append(("worker_stopped", worker.worker_id, worker.processed))


@pytest.fixture
def recorder(tm: Taskmill) -> Recorder:
    recorder = Recorder()
    tm.add_plugin(recorder, name="recorder")
    return recorder


async def test_a_completed_task_fires_enqueued_started_and_finished_once(
    tm: Taskmill, recorder: Recorder
):
    @tm.handler("ok")
    async def ok(ctx: Context, params: dict) -> str:
        return "done"

    task = await tm.enqueue("ok")
    await drain(tm)

    assert recorder.of(task) == [
        ("enqueued", TaskStatus.PENDING),
        ("started", 1),
        ("finished", OK, TaskStatus.COMPLETED, None),
    ]


async def test_a_failed_attempt_fires_finished_then_retried_and_the_retry_runs(
    tm: Taskmill, recorder: Recorder
):
    @tm.handler("flaky", max_retries=2)
    async def flaky(ctx: Context, params: dict) -> str:
        if ctx.task.attempts == 1:
            raise RuntimeError("connection reset")
        return "ok"

    task = await tm.enqueue("flaky")
    await drain(tm)

    assert recorder.of(task) == [
        ("enqueued", TaskStatus.PENDING),
        ("started", 1),
        ("finished", FAILED, TaskStatus.PENDING, "RuntimeError: connection reset"),
        ("retried", 1, "RuntimeError: connection reset"),
        ("started", 2),
        ("finished", OK, TaskStatus.COMPLETED, None),
    ]
    # The hooks get the stored error whole: with the handler's traceback excerpt.
    assert all("in flaky" in e and e.startswith("RuntimeError") for e in recorder.errors)
    assert len(recorder.errors) == 2


async def test_exhausted_retries_and_fail_fire_dead_lettered_once(tm: Taskmill, recorder: Recorder):
    @tm.handler("broken", max_retries=1)
    async def broken(ctx: Context, params: dict) -> None:
        raise ValueError("always")

    @tm.handler("rejects", max_retries=5)
    def rejects(ctx: Context, params: dict) -> None:
        raise Fail("not an image")

    broken_task = await tm.enqueue("broken")
    rejected = await tm.enqueue("rejects")
    await drain(tm)

    gave_up = "ValueError: always (gave up after 2 attempts)"
    assert recorder.of(broken_task)[1:] == [
        ("started", 1),
        ("finished", FAILED, TaskStatus.PENDING, "ValueError: always"),
        ("retried", 1, "ValueError: always"),
        ("started", 2),
        ("finished", FAILED, TaskStatus.FAILED, gave_up),
        ("dead_lettered", TaskStatus.FAILED, gave_up),
    ]
    assert recorder.of(rejected)[1:] == [
        ("started", 1),
        ("finished", FAILED, TaskStatus.FAILED, "not an image"),
        ("dead_lettered", TaskStatus.FAILED, "not an image"),
    ]


async def test_a_timeout_finishes_the_attempt_as_timed_out(tm: Taskmill, recorder: Recorder):
    @tm.handler("slow", timeout=0.1, max_retries=1)
    async def slow(ctx: Context, params: dict) -> None:
        await asyncio.sleep(30)

    task = await tm.enqueue("slow")
    await drain(tm)

    error = "timed out after 0.1 s"
    assert recorder.of(task)[1:] == [
        ("started", 1),
        ("finished", AttemptOutcome.TIMED_OUT, TaskStatus.PENDING, error),
        ("retried", 1, error),
        ("started", 2),
        (
            "finished",
            AttemptOutcome.TIMED_OUT,
            TaskStatus.FAILED,
            f"{error} (gave up after 2 attempts)",
        ),
        ("dead_lettered", TaskStatus.FAILED, f"{error} (gave up after 2 attempts)"),
    ]
    outcomes = [a.outcome for a in await tm.attempts(task.id)]
    assert outcomes == [AttemptOutcome.TIMED_OUT, AttemptOutcome.TIMED_OUT]


async def test_cancelling_a_running_task_fires_cancelled_once_and_finishes_its_attempt(
    tm: Taskmill, recorder: Recorder
):
    @tm.handler("forever")
    async def forever(ctx: Context, params: dict) -> None:
        await asyncio.sleep(60)

    task = await tm.enqueue("forever")
    async with Background(tm, cancel_check_interval=0.02):

        async def started() -> bool:
            return bool(recorder.named("started"))

        await wait_until(started)
        cancelled = await tm.cancel(task.id)
        assert cancelled.status is TaskStatus.CANCELLED

        async def finished() -> bool:
            return bool(recorder.named("finished"))

        await wait_until(finished)

    assert recorder.of(task)[1:] == [
        ("started", 1),
        ("cancelled", TaskStatus.CANCELLED, CancelReason.USER),
        ("finished", AttemptOutcome.CANCELLED, TaskStatus.CANCELLED, "cancelled (user)"),
    ]
    assert [a.outcome for a in await tm.attempts(task.id)] == [AttemptOutcome.CANCELLED]


async def test_cancelling_pending_tasks_fires_cancelled_per_task_with_its_reason(
    tm: Taskmill, recorder: Recorder
):
    parent = await tm.enqueue("parent")
    (child,) = await tm.batch_children(parent.id, [{"task_type": "child"}])
    old = await tm.enqueue("refresh", dedupe_key="feed")
    alias = await tm.enqueue("refresh", dedupe_key="feed")
    assert alias.alias_of == old.id

    await tm.cancel(parent.id)
    assert await tm.preempt("refresh") == 2

    assert recorder.of(parent)[1:] == [("cancelled", TaskStatus.CANCELLED, CancelReason.USER)]
    assert recorder.of(child)[1:] == [("cancelled", TaskStatus.CANCELLED, CancelReason.USER)]
    for task in (old, alias):
        assert recorder.of(task)[1:] == [
            ("cancelled", TaskStatus.CANCELLED, CancelReason.PREEMPTED)
        ]
    assert not recorder.named("started") and not recorder.named("finished")


async def test_a_handler_that_raises_cancelled_itself_fires_finished_and_cancelled(
    tm: Taskmill, recorder: Recorder
):
    @tm.handler("gives-up")
    async def gives_up(ctx: Context, params: dict) -> None:
        raise Cancelled("nothing left to do")

    task = await tm.enqueue("gives-up")
    await drain(tm)

    assert recorder.of(task)[1:] == [
        ("started", 1),
        ("finished", AttemptOutcome.CANCELLED, TaskStatus.CANCELLED, "cancelled (user)"),
        ("cancelled", TaskStatus.CANCELLED, CancelReason.USER),
    ]


async def test_a_shutdown_interrupts_an_attempt_without_a_retry_or_a_cancel(
    tm: Taskmill, recorder: Recorder
):
    release = asyncio.Event()

    @tm.handler("long")
    async def long(ctx: Context, params: dict) -> None:
        await release.wait()

    task = await tm.enqueue("long")
    worker = tm.worker(**worker_options())
    running = asyncio.create_task(worker.run())

    async def started() -> bool:
        return bool(recorder.named("started"))

    await wait_until(started)
    await worker.stop(grace=0)
    await asyncio.wait_for(running, 10)

    assert recorder.of(task)[1:] == [
        ("started", 1),
        ("finished", AttemptOutcome.INTERRUPTED, TaskStatus.PENDING, "cancelled (shutdown)"),
    ]
    back = await tm.get(task.id)
    assert back is not None and back.status is TaskStatus.PENDING
    assert recorder.calls[-1] == ("worker_stopped", worker.worker_id, 1)


async def test_worker_started_and_stopped_fire_once_around_its_work(
    tm: Taskmill, recorder: Recorder
):
    @tm.handler("ok")
    async def ok(ctx: Context, params: dict) -> None:
        return None

    await tm.enqueue_many([{"task_type": "ok"} for _ in range(3)])
    worker = await tm.run_worker(until_idle=True, **worker_options())

    hooks = [c[0] for c in recorder.calls if c[0] != "enqueued"]
    assert hooks[0] == "worker_started" and hooks[-1] == "worker_stopped"
    assert hooks.count("worker_started") == hooks.count("worker_stopped") == 1
    assert recorder.named("worker_started") == [("worker_started", worker.worker_id, 0)]
    assert recorder.named("worker_stopped") == [("worker_stopped", worker.worker_id, 3)]


async def test_enqueued_fires_for_every_stored_task_however_it_was_enqueued(
    tm: Taskmill, recorder: Recorder
):
    @tm.handler("parent")
    async def parent(ctx: Context, params: dict) -> str:
        child = await ctx.spawn("child")
        return child.id

    many = await tm.enqueue_many([{"task_type": "a"}, {"task_type": "b"}])
    leader = await tm.enqueue("a", dedupe_key="k")
    alias = await tm.enqueue("a", dedupe_key="k")
    app_task = await tm.for_app("photos").enqueue("c")
    spawner = await tm.enqueue("parent")
    await drain(tm)
    spawned = (await tm.wait(spawner.id, timeout=5)).result

    enqueued = [c[1] for c in recorder.named("enqueued")]
    expected = [*(t.id for t in many), leader.id, alias.id, app_task.id, spawner.id, spawned]
    assert enqueued == expected


async def test_rescued_tasks_fire_retried_or_dead_lettered_in_the_rescuing_worker(
    tm: Taskmill, recorder: Recorder
):
    @tm.handler("job", max_retries=1)
    async def job(ctx: Context, params: dict) -> str:
        return "ran"

    retried = await tm.enqueue("job", max_retries=1)
    dead = await tm.enqueue("job", max_retries=0)
    # A worker that claims both and dies: its leases run out.
    claimed = await tm.storage.claim_batch(
        ClaimRequest(worker_id="ghost", handlers={(None, "job"): None}, limit=2, lease_seconds=0.05)
    )
    assert len(claimed) == 2

    async def leases_expired() -> bool:
        current = [await tm.get(t.id) for t in claimed]
        return all(
            t is not None and t.lease_expires_at is not None and t.lease_expires_at < utcnow()
            for t in current
        )

    await wait_until(leases_expired)
    # tick() rescues first, then claims (the retried task is due at once) and runs.
    assert await tm.worker(**worker_options()).tick() == 1

    assert recorder.of(retried)[1:] == [
        ("retried", 1, "lease expired"),
        ("started", 2),
        ("finished", OK, TaskStatus.COMPLETED, None),
    ]
    assert recorder.of(dead)[1:] == [("dead_lettered", TaskStatus.FAILED, "lease expired")]


async def test_a_detached_attempt_fires_detached_instead_of_finished_then_is_rescued(
    tm: Taskmill, recorder: Recorder
):
    log: list[str] = []
    tm.add_plugin(Tracer(log), name="tracer")

    @tm.handler("handoff", max_retries=0)
    async def handoff(ctx: Context, params: dict) -> None:
        raise Detached("the receiver took it over")

    task = await tm.enqueue("handoff")
    # The owner never reports: the lease the worker stopped renewing runs out.
    async with Background(tm, lease_seconds=0.3, rescue_interval=0.05):
        rescued = await tm.wait(task.id, timeout=10)
    assert rescued.status is TaskStatus.FAILED
    assert recorder.of(task)[1:] == [
        ("started", 1),
        ("detached", 1),
        ("dead_lettered", TaskStatus.FAILED, "lease expired"),
    ]
    assert "tracer saw Detached" in log  # the handler's wrappers see the hand-over


async def test_async_hook_implementations_are_awaited(tm: Taskmill):
    seen: list[tuple[str, str]] = []

    class Slow:
        @hookimpl
        async def taskmill_task_enqueued(self, task: Task) -> None:
            await asyncio.sleep(0.01)
            seen.append(("enqueued", task.id))

        @hookimpl
        async def taskmill_task_finished(self, task: Task, outcome: AttemptOutcome) -> None:
            await asyncio.sleep(0.01)
            seen.append(("finished", outcome.value))

        @hookimpl
        async def taskmill_worker_stopped(self) -> None:
            await asyncio.sleep(0.01)
            seen.append(("stopped", ""))

    tm.add_plugin(Slow())

    @tm.handler("ok")
    async def ok(ctx: Context, params: dict) -> None:
        return None

    task = await tm.enqueue("ok")
    assert seen == [("enqueued", task.id)]
    await drain(tm)
    assert seen == [("enqueued", task.id), ("finished", "completed"), ("stopped", "")]


async def test_a_hook_that_raises_is_logged_with_its_plugin_and_breaks_nothing(
    tm: Taskmill, recorder: Recorder, caplog: pytest.LogCaptureFixture
):
    class Exploding:
        @hookimpl(tryfirst=True)
        def taskmill_task_finished(self) -> None:
            raise RuntimeError("metrics backend down")

        @hookimpl
        async def taskmill_task_started(self) -> None:
            raise RuntimeError("tracer down")

        @hookimpl
        def taskmill_worker_started(self) -> None:
            raise RuntimeError("cannot open port")

        @hookimpl
        def taskmill_handler_context(self) -> contextlib.AbstractContextManager[None]:
            raise RuntimeError("no span for you")

    tm.add_plugin(Exploding(), name="exploding")

    @tm.handler("ok")
    async def ok(ctx: Context, params: dict) -> str:
        return "fine"

    tasks = await tm.enqueue_many([{"task_type": "ok"} for _ in range(3)])
    with caplog.at_level(logging.ERROR, logger="taskmill.plugins"):
        await drain(tm)

    for task in tasks:
        assert (await tm.wait(task.id, timeout=5)).result == "fine"
        # The recorder, called after the exploding plugin, still saw everything.
        assert recorder.of(task)[-1] == ("finished", OK, TaskStatus.COMPLETED, None)
    messages = [r.getMessage() for r in caplog.records]
    assert (
        messages.count(
            "plugin 'exploding' (added in code): taskmill_task_finished failed (ignored)"
        )
        == 3
    )
    assert "plugin 'exploding' (added in code): taskmill_task_started failed (ignored)" in messages
    assert (
        "plugin 'exploding' (added in code): taskmill_worker_started failed (ignored)" in messages
    )
    assert any("'exploding'" in m and "handler context failed" in m for m in messages)


# -- wrapping handlers ----------------------------------------------------------------

SPAN: contextvars.ContextVar[str] = contextvars.ContextVar("SPAN", default="none")


class Tracer:
    """A plain context manager per attempt that sets SPAN, like a tracing plugin."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    @hookimpl
    def taskmill_handler_context(
        self, task: Task, ctx: Context
    ) -> contextlib.AbstractContextManager[None]:
        return self._span(task)

    @contextlib.contextmanager
    def _span(self, task: Task) -> Iterator[None]:
        token = SPAN.set(f"span-{task.task_type}")
        self.log.append(f"tracer enter {task.task_type}")
        try:
            yield
        except BaseException as exc:
            self.log.append(f"tracer saw {type(exc).__name__}")
            raise
        finally:
            SPAN.reset(token)
            self.log.append(f"tracer exit {task.task_type}")


class Timer:
    """An async context manager per attempt, entered inside the tracer's."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    @hookimpl
    async def taskmill_handler_context(
        self, task: Task
    ) -> contextlib.AbstractAsyncContextManager[None]:
        return self._timing(task)

    @contextlib.asynccontextmanager
    async def _timing(self, task: Task) -> AsyncIterator[None]:
        self.log.append(f"timer enter {task.task_type} in {SPAN.get()}")
        try:
            yield
        finally:
            self.log.append(f"timer exit {task.task_type}")


async def test_handler_contexts_wrap_async_and_sync_handlers_and_set_their_context(tm: Taskmill):
    log: list[str] = []
    # pluggy calls the last registered first: the timer is outermost... unless the
    # tracer says tryfirst. Registered in this order, the tracer is innermost.
    tm.add_plugin(Tracer(log), name="tracer")
    tm.add_plugin(Timer(log), name="timer")

    @tm.handler("async")
    async def async_handler(ctx: Context, params: dict) -> str:
        log.append("async handler runs")
        return SPAN.get()

    @tm.handler("sync")
    def sync_handler(ctx: Context, params: dict) -> list[str]:
        log.append("sync handler runs")
        return [SPAN.get(), threading.current_thread().name]

    first = await tm.enqueue("async")
    await drain(tm)
    second = await tm.enqueue("sync")
    await drain(tm)

    assert (await tm.wait(first.id, timeout=5)).result == "span-async"
    span, thread = (await tm.wait(second.id, timeout=5)).result
    assert span == "span-sync" and thread != threading.main_thread().name
    assert log == [
        "timer enter async in none",
        "tracer enter async",
        "async handler runs",
        "tracer exit async",
        "timer exit async",
        "timer enter sync in none",
        "tracer enter sync",
        "sync handler runs",
        "tracer exit sync",
        "timer exit sync",
    ]


async def test_handler_contexts_see_the_error_and_cannot_swallow_it(tm: Taskmill):
    log: list[str] = []

    class Swallower:
        @hookimpl(trylast=True)
        def taskmill_handler_context(self) -> contextlib.AbstractContextManager[None]:
            return contextlib.suppress(Exception)

    tm.add_plugin(Tracer(log), name="tracer")
    tm.add_plugin(Swallower())

    @tm.handler("fails", max_retries=0)
    async def fails(ctx: Context, params: dict) -> None:
        raise ValueError("bad input")

    @tm.handler("slow", max_retries=0, timeout=0.05)
    def slow(ctx: Context, params: dict) -> None:
        while not ctx.cancelled:
            threading.Event().wait(0.01)

    failing = await tm.enqueue("fails")
    timing_out = await tm.enqueue("slow")
    await drain(tm)

    failed = await tm.wait(failing.id, timeout=5)
    assert failed.status is TaskStatus.FAILED and "ValueError: bad input" in str(failed.error)
    timed_out = await tm.wait(timing_out.id, timeout=5)
    assert timed_out.status is TaskStatus.FAILED
    assert [a.outcome for a in await tm.attempts(timing_out.id)] == [AttemptOutcome.TIMED_OUT]
    assert "tracer saw ValueError" in log
    assert "tracer saw TimeoutError" in log


async def test_a_handler_context_that_fails_to_enter_is_skipped(
    tm: Taskmill, caplog: pytest.LogCaptureFixture
):
    class Broken:
        @hookimpl
        def taskmill_handler_context(self) -> object:
            return object()  # not a context manager

    log: list[str] = []
    tm.add_plugin(Broken())
    tm.add_plugin(Tracer(log), name="tracer")

    @tm.handler("ok")
    async def ok(ctx: Context, params: dict) -> str:
        return SPAN.get()

    task = await tm.enqueue("ok")
    with caplog.at_level(logging.ERROR, logger="taskmill.plugins"):
        await drain(tm)

    assert (await tm.wait(task.id, timeout=5)).result == "span-ok"
    assert any("not a context manager" in r.getMessage() for r in caplog.records)


async def test_a_task_cancelled_while_its_handler_returns_still_finishes_its_attempt_once(
    tm: Taskmill, recorder: Recorder
):
    @tm.handler("self-cancelling")
    async def self_cancelling(ctx: Context, params: dict) -> str:
        # The cancel lands while the handler is finishing: the worker's outcome write
        # then finds the lease gone, and the store keeps CANCELLED.
        await tm.cancel(ctx.task.id)
        return "too late"

    task = await tm.enqueue("self-cancelling")
    await drain(tm)

    assert (await tm.wait(task.id, timeout=5)).status is TaskStatus.CANCELLED
    assert recorder.of(task)[1:] == [
        ("started", 1),
        ("cancelled", TaskStatus.CANCELLED, CancelReason.USER),
        ("finished", AttemptOutcome.CANCELLED, TaskStatus.CANCELLED, "cancelled (user)"),
    ]
