"""Delete on finish on PostgreSQL, beyond the shipped RetentionContract: the two ways
the finish statement deletes (a deleting COMPLETE deletes its row without updating it;
a deleting FAIL is updated, then forgotten by ``forget_tasks``) mixed in one batch, and
the settlement of aliases and dependents that an enqueue commits while a deleting
finish waits for the row it share-locked (seen only by the functions' fresh
snapshots)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest
from taskmill.model import EventKind, Task, TaskStatus
from taskmill.storage import FinishKind
from taskmill.testing import claim, finish, new_task, wait_until
from taskmill.testing.events import read_all_events
from taskmill_postgres import PostgresStorage

from tests.conftest import POSTGRES_URL

_DEADLINE = 30


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[PostgresStorage]:
    s = PostgresStorage.from_url(postgres_url)
    await s.open()
    yield s
    await s.close()


async def _rows(store: PostgresStorage, table: str, seqs: list[int]) -> int:
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        column = "task_seq" if table == "attempts" else "seq"
        count: int = await conn.fetchval(
            f"SELECT count(*) FROM {store.sql.quoted}.{table} WHERE {column} = ANY($1::bigint[])",
            seqs,
        )
        return count
    finally:
        await conn.close()


async def _seqs(store: PostgresStorage, *tasks: Task) -> list[int]:
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        return [
            await conn.fetchval(f"SELECT seq FROM {store.sql.quoted}.tasks WHERE id = $1", t.id)
            for t in tasks
        ]
    finally:
        await conn.close()


async def test_one_batch_deletes_both_ways_keeps_the_rest_and_leaves_no_log(
    store: PostgresStorage,
):
    _, start = await store.read_events(None)
    done_leader, failed_leader, plain_fail, kept = await store.enqueue(
        [new_task(dedupe_key="d"), new_task(dedupe_key="f"), new_task(), new_task()]
    )
    done_aliases = await store.enqueue([new_task(dedupe_key="d") for _ in range(2)])
    (failed_alias,) = await store.enqueue([new_task(dedupe_key="f")])
    # An earlier attempt in the log of every task that the batch deletes.
    first = {t.id: t for t in await store.claim_batch(claim())}
    await store.finish_batch([finish(t, FinishKind.RETRY, error="again") for t in first.values()])
    running = {t.id: t for t in await store.claim_batch(claim())}
    deleted = [done_leader, *done_aliases, failed_leader, failed_alias, plain_fail]
    seqs = await _seqs(store, *deleted)
    assert await _rows(store, "attempts", seqs) == 3
    results = await store.finish_batch(
        [
            finish(running[done_leader.id], result={"r": 1}, delete=True),
            finish(running[failed_leader.id], FinishKind.FAIL, error="bad", delete=True),
            finish(running[kept.id], result="kept", delete=False),
            finish(running[plain_fail.id], FinishKind.FAIL, error="worse", delete=True),
        ]
    )
    assert [(t.status, t.result, t.error) if t else None for t in results] == [
        (TaskStatus.COMPLETED, {"r": 1}, None),
        (TaskStatus.FAILED, None, "bad"),
        (TaskStatus.COMPLETED, "kept", None),
        (TaskStatus.FAILED, None, "worse"),
    ]
    assert await _rows(store, "tasks", seqs) == 0
    assert await _rows(store, "attempts", seqs) == 0
    assert await _rows(store, "tombstones", seqs) == len(deleted)
    expected = {
        **{t.id: (TaskStatus.COMPLETED, {"r": 1}, None) for t in (done_leader, *done_aliases)},
        **{t.id: (TaskStatus.FAILED, None, "bad") for t in (failed_leader, failed_alias)},
        plain_fail.id: (TaskStatus.FAILED, None, "worse"),
    }
    for task_id, (status, result, error) in expected.items():
        gone = await store.deleted_task(task_id)
        assert gone is not None and (gone.status, gone.result, gone.error) == (
            status,
            result,
            error,
        )
        assert gone.attempts == (2 if task_id in running else 0)
    kept_now = await store.get(kept.id)
    assert kept_now is not None and len(await store.attempts(kept.id)) == 2
    # The events: each deleted leader's end followed by its aliases', every one carrying
    # the tombstone.
    events = [e for e in await read_all_events(store, start) if e.kind is not EventKind.ENQUEUED]
    ends = [(e.task.id, e.kind) for e in events[-len(expected) - 1 :]]
    assert ends == [
        (done_leader.id, EventKind.COMPLETED),
        *[(a.id, EventKind.COMPLETED) for a in done_aliases],
        (failed_leader.id, EventKind.FAILED),
        (failed_alias.id, EventKind.FAILED),
        (kept.id, EventKind.COMPLETED),
        (plain_fail.id, EventKind.FAILED),
    ]
    for event in events:
        if event.task.id in expected:
            assert event.task.status is expected[event.task.id][0]


async def test_a_dependent_of_deleted_and_kept_tasks_is_released_once_by_the_last(
    store: PostgresStorage,
):
    gone, kept, failed = await store.enqueue([new_task("a"), new_task("a"), new_task("a")])
    (both,) = await store.enqueue([new_task("b", after=(gone.id, kept.id))])
    (cancelled,) = await store.enqueue([new_task("b", after=(gone.id, failed.id))])
    running = {t.id: t for t in await store.claim_batch(claim("a"))}
    await store.finish_batch(
        [
            finish(running[gone.id], result=1, delete=True),
            finish(running[kept.id], result=2),
            finish(running[failed.id], FinishKind.FAIL, error="x"),
        ]
    )
    claimed = await store.claim_batch(claim("b"))
    assert [t.id for t in claimed] == [both.id]
    now = await store.get(cancelled.id)
    assert now is not None and now.status is TaskStatus.CANCELLED


async def test_a_task_id_deleted_twice_keeps_its_last_tombstone(store: PostgresStorage):
    task = new_task(params={"n": 1})
    await store.enqueue([task])
    (running,) = await store.claim_batch(claim())
    await store.finish_batch([finish(running, result="first", delete=True)])
    await store.enqueue([task])  # the id is free again
    (running,) = await store.claim_batch(claim())
    await store.finish_batch([finish(running, result="second", delete=True)])
    gone = await store.deleted_task(task.id)
    assert gone is not None and gone.result == "second"
    # Pruning what is younger than an hour keeps it.
    await store.prune_events(timedelta(hours=1))
    assert await store.deleted_task(task.id) is not None


async def _blocked_behind(
    store: PostgresStorage, holder: asyncpg.Connection, running: Task
) -> asyncio.Task[list[Task | None]]:
    """A deleting finish of ``running`` started while ``holder`` share-locks its row (as
    an enqueue does while it decides an alias or a dependency): returns the finish,
    once it waits for that lock."""
    probe = await asyncpg.connect(POSTGRES_URL)
    holder_pid = holder.get_server_pid()

    async def waiting() -> bool:
        blocked: int = await probe.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
            holder_pid,
        )
        return blocked > 0

    finishing = asyncio.create_task(
        store.finish_batch([finish(running, result={"late": True}, delete=True)])
    )
    try:
        await wait_until(waiting)
    finally:
        await probe.close()
    assert not finishing.done()
    return finishing


_INSERT = (
    "INSERT INTO {s}.tasks (id, task_type, status, created_at, run_at, updated_at, params,"
    " priority, max_retries, dedupe_key, alias_of, waiting_on)"
    " VALUES ($1, $2, 'pending', now(), now(), now(), '{{}}', 0, 0, $3, $4, $5)"
)


async def test_an_alias_committed_while_a_deleting_finish_waits_takes_the_result_and_goes(
    store: PostgresStorage,
):
    (leader,) = await store.enqueue([new_task(dedupe_key="k")])
    (running,) = await store.claim_batch(claim())
    holder = await asyncpg.connect(POSTGRES_URL)
    alias_id = str(uuid.uuid4())
    try:
        await holder.execute("BEGIN")
        await holder.execute(
            f"SELECT 1 FROM {store.sql.quoted}.tasks WHERE id = $1 FOR SHARE", leader.id
        )
        await holder.execute(_INSERT.format(s=store.sql.quoted), alias_id, "job", "k", leader.id, 0)
        finishing = await _blocked_behind(store, holder, running)
        await holder.execute("COMMIT")
        async with asyncio.timeout(_DEADLINE):
            (done,) = await finishing
    finally:
        await holder.close()
    assert done is not None and done.status is TaskStatus.COMPLETED
    assert await store.get(alias_id) is None
    alias = await store.deleted_task(alias_id)
    assert alias is not None and (alias.status, alias.result) == (
        TaskStatus.COMPLETED,
        {"late": True},
    )


async def test_a_dependent_committed_while_a_deleting_finish_waits_is_released(
    store: PostgresStorage,
):
    (dependency,) = await store.enqueue([new_task()])
    (running,) = await store.claim_batch(claim())
    holder = await asyncpg.connect(POSTGRES_URL)
    dependent_id = str(uuid.uuid4())
    try:
        await holder.execute("BEGIN")
        await holder.execute(
            f"SELECT 1 FROM {store.sql.quoted}.tasks WHERE id = $1 FOR SHARE", dependency.id
        )
        await holder.execute(_INSERT.format(s=store.sql.quoted), dependent_id, "b", None, None, 1)
        await holder.execute(
            f"INSERT INTO {store.sql.quoted}.task_dependencies (depends_on, task_id, always)"
            " VALUES ($1, $2, false)",
            dependency.id,
            dependent_id,
        )
        finishing = await _blocked_behind(store, holder, running)
        await holder.execute("COMMIT")
        async with asyncio.timeout(_DEADLINE):
            await finishing
    finally:
        await holder.close()
    assert await store.get(dependency.id) is None
    (released,) = await store.claim_batch(claim("b"))
    assert released.id == dependent_id
