"""The threads that run sync handlers: reused, never bounded, ended when idle."""

from __future__ import annotations

import contextvars
import threading
import time

from taskmill import Context, Taskmill, TaskStatus
from taskmill.handler_threads import THREAD_NAME, HandlerThreads

LAST: contextvars.ContextVar[int | None] = contextvars.ContextVar("LAST", default=None)


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        time.sleep(0.005)


def _recorder(ran: list[int], done: threading.Event):
    def call() -> None:
        ran.append(threading.get_ident())
        done.set()

    return call


def test_a_free_thread_is_reused_and_a_busy_one_is_not_waited_for():
    pool = HandlerThreads(idle_seconds=30)
    ran: list[int] = []
    first = threading.Event()
    pool.submit(_recorder(ran, first))
    assert first.wait(5)
    _wait_for(lambda: pool.idle == 1)
    second = threading.Event()
    pool.submit(_recorder(ran, second))
    assert second.wait(5)
    assert ran[0] == ran[1], "the idle thread took the second call"

    # A call that never ends keeps its thread; the next call still starts at once.
    _wait_for(lambda: pool.idle == 1)
    stuck, release = threading.Event(), threading.Event()

    def hang() -> None:
        stuck.set()
        release.wait(10)

    pool.submit(hang)
    assert stuck.wait(5)
    third = threading.Event()
    pool.submit(_recorder(ran, third))
    try:
        assert third.wait(5), "a call waited for a busy thread"
        assert ran[2] != ran[0]
    finally:
        release.set()
    _wait_for(lambda: pool.idle == 2)


def test_an_idle_thread_ends_and_a_later_call_still_runs():
    pool = HandlerThreads(idle_seconds=0.05)
    done = threading.Event()
    ident: list[int] = []
    pool.submit(_recorder(ident, done))
    assert done.wait(5)
    _wait_for(lambda: all(t.ident != ident[0] for t in threading.enumerate()))
    assert pool.idle == 0
    # Many calls racing idle timeouts: every one runs, none is left in the queue.
    count = 500
    finished = threading.Semaphore(0)
    for i in range(count):
        pool.submit(finished.release)
        if i % 50 == 0:
            time.sleep(0.06)  # let threads reach their idle timeout between bursts
    for _ in range(count):
        assert finished.acquire(timeout=5), "a submitted call never ran"


async def test_sync_handlers_run_on_reused_threads_with_their_own_context(tm: Taskmill):
    threads: list[threading.Thread] = []  # kept alive, so no two are ever the same object
    seen: list[object] = []

    @tm.handler("sync.reuse")
    def work(ctx: Context, params: dict) -> int:
        threads.append(threading.current_thread())
        seen.append(LAST.get())
        LAST.set(params["n"])  # set in the attempt's own copy of the context
        return params["n"]

    tasks = [await tm.enqueue("sync.reuse", {"n": n}) for n in range(20)]
    worker = tm.worker(concurrency=1, handle_signals=False, min_poll_interval=0.01)
    await worker.run_until_idle()
    for task in tasks:
        done = await tm.get(task.id)
        assert done is not None and done.status is TaskStatus.COMPLETED
    assert {thread.name for thread in threads} == {THREAD_NAME}
    # One slot: every attempt found an idle thread, so fewer threads than attempts ran.
    assert len(set(threads)) < len(threads)
    assert seen == [None] * len(tasks), "a context variable leaked into the next attempt"
