"""A worker whose database becomes unreachable still stops, and nothing is lost."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from taskmill import Context, Task, Taskmill, TaskStatus
from taskmill.testing import wait_until


async def test_stop_returns_while_the_database_is_locked_and_the_task_is_rescued_later(
    tmp_path: Path,
):
    path = tmp_path / "outage.db"
    url = f"sqlite:///{path}?busy_timeout=0.1"
    started = asyncio.Event()
    async with Taskmill(url, plugins=False) as tm:

        @tm.handler("long")
        async def long(ctx: Context, params: dict) -> str:
            if ctx.task.attempts == 1:
                started.set()
                await asyncio.sleep(60)
            return "second attempt"

        task = await tm.enqueue("long")
        worker = tm.worker(handle_signals=False, lease_seconds=1.0, min_poll_interval=0.01)
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 10)

        # Another process-like connection takes the write lock and keeps it: every write
        # of the worker now fails with "database is locked".
        blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            # The stop returns (the deadlines fail the test if it hangs on the lock).
            await asyncio.wait_for(worker.stop(grace=0), 60)
            await asyncio.wait_for(running, 10)
        finally:
            blocker.execute("ROLLBACK")

        # The interrupted attempt could not be written: the task is still RUNNING under
        # the dead worker's lease, and another worker rescues and completes it.
        current = await tm.get(task.id)
        assert current is not None and current.status is TaskStatus.RUNNING

        async def completed() -> bool:
            done = await tm.get(task.id)
            return done is not None and done.status is TaskStatus.COMPLETED

        rescuer = tm.worker(handle_signals=False, rescue_interval=0.1, min_poll_interval=0.01)
        rescuing = asyncio.create_task(rescuer.run())
        await wait_until(completed, timeout=30)
        await rescuer.stop(grace=5)
        await rescuing
        done = await tm.get(task.id)
        assert done is not None and done.result == "second attempt"
        assert done.attempts == 2


@contextlib.asynccontextmanager
async def _store_with_a_quick_task(
    tmp_path: Path,
) -> AsyncIterator[tuple[Taskmill, Task, sqlite3.Connection]]:
    """A SQLite store with one task of a quick handler, whose write lock another
    connection (the third item: ROLLBACK it to end the outage) holds from the start."""
    path = tmp_path / "outage.db"
    async with Taskmill(f"sqlite:///{path}?busy_timeout=0.05", plugins=False) as tm:

        @tm.handler("quick")
        async def quick(ctx: Context, params: dict) -> str:
            return "done"

        task = await tm.enqueue("quick")
        blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            yield tm, task, blocker
        finally:
            if blocker.in_transaction:
                blocker.execute("ROLLBACK")
            blocker.close()


async def test_an_unreachable_store_is_logged_as_one_line_per_retry_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """While the store cannot be used (here: another connection holds SQLite's write
    lock), each failed claim is one WARNING line with the store's message, not a
    traceback; and the worker carries on once the store is back."""
    async with _store_with_a_quick_task(tmp_path) as (tm, task, blocker):
        caplog.set_level(logging.WARNING, logger="taskmill")
        worker = tm.worker(handle_signals=False, min_poll_interval=0.01, poll_interval=0.05)
        running = asyncio.create_task(worker.run())
        try:

            def failures() -> list[logging.LogRecord]:
                return [r for r in caplog.records if r.getMessage().startswith("claiming failed")]

            async def retried() -> bool:
                return len(failures()) >= 2

            await wait_until(retried, timeout=30)
        finally:
            blocker.execute("ROLLBACK")
        for record in failures():
            assert record.levelno == logging.WARNING
            assert record.exc_info is None
            assert "locked" in record.getMessage()

        async def completed() -> bool:
            done = await tm.get(task.id)
            return done is not None and done.status is TaskStatus.COMPLETED

        await wait_until(completed, timeout=30)
        await worker.stop(grace=5)
        await running


async def test_a_worker_relying_on_notifications_retries_a_failed_claim_within_a_second(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A worker whose poll is long (it relies on its store's notifications, or is just
    set to poll rarely) retries a failed claim from a short pause, not after a whole
    poll interval: once the store is back it claims within about a second."""
    async with _store_with_a_quick_task(tmp_path) as (tm, task, blocker):
        caplog.set_level(logging.WARNING, logger="taskmill")
        worker = tm.worker(handle_signals=False, min_poll_interval=300, poll_interval=300)
        running = asyncio.create_task(worker.run())
        try:

            async def failed_once() -> bool:
                return any(r.getMessage().startswith("claiming failed") for r in caplog.records)

            await wait_until(failed_once, timeout=30)
        finally:
            blocker.execute("ROLLBACK")
        back = time.monotonic()

        async def completed() -> bool:
            done = await tm.get(task.id)
            return done is not None and done.status is TaskStatus.COMPLETED

        await wait_until(completed, timeout=60)
        took = time.monotonic() - back
        await worker.stop(grace=5)
        await running
    # Backoff from 0.05 s: the retries after the lock is gone come within seconds (the
    # old pause was min_poll_interval, 300 s here, so this waited out the deadline).
    assert took < 20, took
