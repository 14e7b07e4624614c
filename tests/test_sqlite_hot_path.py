"""``sqlite:///`` on a worker's hot path (issue 14): the batched statements find their rows
by id whatever the statistics say, and the lease checks while another process holds the
database's write lock."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from taskmill.backends.sqlite import SQLiteStorage
from taskmill.errors import StorageUnavailable
from taskmill.model import Progress, TaskFilter, TaskStatus
from taskmill.storage import ProgressUpdate
from taskmill.testing import claim, finish, lease_of, new_task, wait_until

_DEADLINE = 10.0
"""Seconds a call gets to return; the tests check that it returns, not how fast."""


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStorage]:
    s = SQLiteStorage.from_url(f"sqlite:///{tmp_path / 'tasks.db'}?busy_timeout=0.5")
    await s.open()
    yield s
    await s.close()


async def _traced(store: SQLiteStorage, call: Callable[[], Awaitable[Any]]) -> list[str]:
    """The statements the store's own connection runs during ``call``."""
    statements: list[str] = []

    def trace(on: bool) -> None:
        conn = store._conn  # lives on the store's database thread: set it there
        assert conn is not None
        conn.set_trace_callback(statements.append if on else None)

    await store._run(trace, True)
    try:
        await call()
    finally:
        await store._run(trace, False)
    return [s for s in statements if s.split(None, 1)[0].upper() in ("SELECT", "UPDATE")]


async def test_the_hot_path_finds_its_rows_by_id_with_statistics_taken_early(
    store: SQLiteStorage,
):
    """Statistics taken while one task was RUNNING say the partial index ``tasks_lease``
    holds one row; the finish statement used to read every RUNNING task through it and
    scan its batch once per task. No statement of the hot path scans ``tasks`` now."""
    await store.enqueue([new_task() for _ in range(600)])
    await store.claim_batch(claim(limit=1, lease=3600))
    analyzer = sqlite3.connect(store.path, isolation_level=None)
    try:
        analyzer.execute("ANALYZE")
        running = await store.claim_batch(claim(limit=300, lease=3600))
        leases = [lease_of(t) for t in running]
        updates = [ProgressUpdate(lease, Progress(1, 2)) for lease in leases]
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: store.claim_batch(claim(limit=100)),
            lambda: store.renew_leases(leases, 60),
            lambda: store.watch_leases(leases),
            lambda: store.save_progress(updates),
            lambda: store.rescue_expired(limit=100),
            lambda: store.finish_batch([finish(t) for t in running]),
        ]
        statements = [s for call in calls for s in await _traced(store, call)]
        assert any(s.startswith("UPDATE tasks SET status = 'completed'") for s in statements)
        for statement in statements:
            plan = [r[3] for r in analyzer.execute(f"EXPLAIN QUERY PLAN {statement}")]
            assert not [step for step in plan if step.startswith("SCAN tasks")], (
                statement[:200],
                plan,
            )
    finally:
        analyzer.close()
    assert (await store.summary(TaskFilter())).completed == 300


async def test_while_another_process_writes_a_watch_answers_and_a_renewal_gives_up(
    store: SQLiteStorage,
):
    """A watch is a read, which WAL never makes wait; a renewal is a write, which waits
    for the write lock up to ``busy_timeout`` and then fails (the worker tries again at
    its next renewal) instead of hanging."""
    await store.enqueue([new_task()])
    (task,) = await store.claim_batch(claim())
    lease = lease_of(task)
    other = sqlite3.connect(store.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        async with asyncio.timeout(_DEADLINE):
            assert await store.watch_leases([lease]) == {task.id: None}
            with pytest.raises(StorageUnavailable, match="busy_timeout"):
                await store.renew_leases([lease], 30)
        other.execute("ROLLBACK")
        assert await store.renew_leases([lease], 30) == {task.id: None}
    finally:
        other.close()


async def test_a_renewal_behind_a_waiting_finish_waits_its_turn_and_both_end(tmp_path: Path):
    """One store runs its operations one after another on its database thread: a
    renewal issued while the worker's own finish waits for another process's lock
    runs after that finish, and nothing deadlocks once the lock is released."""
    store = SQLiteStorage.from_url(f"sqlite:///{tmp_path / 'tasks.db'}?busy_timeout=20")
    await store.open()
    try:
        await _renewal_behind_a_finish(store)
    finally:
        await store.close()


async def _renewal_behind_a_finish(store: SQLiteStorage) -> None:
    await store.enqueue([new_task()])
    (task,) = await store.claim_batch(claim())
    other = sqlite3.connect(store.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        finishing = asyncio.create_task(store.finish_batch([finish(task, result=1)]))
        renewing = asyncio.create_task(store.renew_leases([lease_of(task)], 30))
        await asyncio.sleep(0.1)
        assert not finishing.done() and not renewing.done()
        other.execute("ROLLBACK")
        async with asyncio.timeout(_DEADLINE):
            (done,) = await finishing
            renewed = await renewing
    finally:
        other.close()
    assert done is not None and done.status is TaskStatus.COMPLETED
    assert renewed == {}  # finished first: the lease no longer holds


async def test_a_write_waiting_for_another_process_tries_the_lock_again_every_few_ms(
    store: SQLiteStorage,
):
    """A write that finds another connection's write lock tries ``BEGIN IMMEDIATE``
    again after 0.2 ms, doubling to 2 ms, instead of leaving it to SQLite's busy
    handler (which sleeps 1, 2, 5, 10, 15, 20, 25... ms and holds a waiting worker's
    slots empty for that long); ``busy_timeout`` is back in place afterwards for every
    other statement."""
    await store.enqueue([new_task()])
    (task,) = await store.claim_batch(claim())
    statements: list[str] = []

    def trace(on: bool) -> None:
        conn = store._conn
        assert conn is not None
        conn.set_trace_callback(statements.append if on else None)

    other = sqlite3.connect(store.path, isolation_level=None)
    await store._run(trace, True)
    try:
        other.execute("BEGIN IMMEDIATE")
        finishing = asyncio.create_task(store.finish_batch([finish(task, result=1)]))

        async def tried_several_times() -> bool:
            return statements.count("BEGIN IMMEDIATE") >= 3

        await wait_until(tried_several_times, timeout=_DEADLINE)
        assert not finishing.done()
        other.execute("ROLLBACK")
        async with asyncio.timeout(_DEADLINE):
            (done,) = await finishing
    finally:
        other.close()
        await store._run(trace, False)
    assert done is not None and done.status is TaskStatus.COMPLETED
    pragmas = [s for s in statements if s.startswith("PRAGMA busy_timeout")]
    assert pragmas == ["PRAGMA busy_timeout = 0", "PRAGMA busy_timeout = 500"]
    # Restored right after the lock was taken: the finish's own statements follow it.
    restored = statements.index("PRAGMA busy_timeout = 500")
    assert statements[restored - 1] == "BEGIN IMMEDIATE"
    assert statements[-1] == "COMMIT"
