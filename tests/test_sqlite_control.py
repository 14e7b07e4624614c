"""Control operations on ``sqlite:///`` beyond the contract suite: real processes
racing on one file, the claim and event statements and their indexes, chunked
selections, and a differential test against the in-memory reference (SPEC 5.6-5.11).

What two store objects on one file must do is in the shipped suite
(``taskmill.testing.concurrency``).
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from taskmill.backends.memory import MemoryStorage
from taskmill.backends.sqlite import SQLiteStorage, claim_statement
from taskmill.cursors import position_token, token_position
from taskmill.model import (
    AttemptOutcome,
    CancelReason,
    EventKind,
    SuspensionScope,
    Task,
    TaskEvent,
    TaskFilter,
    TaskStatus,
)
from taskmill.storage import ClaimRequest, FinishKind, NewTask, TaskStorage
from taskmill.testing import claim, finish, lease_of, new_task, wait_until

from tests.process_support import run_together


def url_of(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStorage]:
    s = SQLiteStorage.from_url(url_of(tmp_path / "tasks.db"))
    await s.open()
    yield s
    await s.close()


def raw(store: SQLiteStorage) -> sqlite3.Connection:
    return sqlite3.connect(store.path, isolation_level=None, timeout=30)


def _plan(conn: sqlite3.Connection, sql: str, params: list) -> str:
    return "\n".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))


# -- several real processes -----------------------------------------------------------------

_ENQUEUER = """
import asyncio, json, sys
from taskmill.backends.sqlite import SQLiteStorage
from taskmill.testing import new_task

async def main():
    store = SQLiteStorage.from_url(sys.argv[1])
    await store.open()
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()
    out = []
    for _ in range(int(sys.argv[2])):
        _, before = await store.read_events(None)
        (task,) = await store.enqueue([new_task("t", dedupe_key="same")])
        _, after = await store.read_events(None)
        out.append([task.id, task.alias_of, before, after])
    await store.close()
    print(json.dumps(out))

asyncio.run(main())
"""


async def _create(url: str) -> None:
    store = SQLiteStorage.from_url(url)
    await store.open()
    await store.close()


async def _read_back(url: str) -> tuple[list[Task], list[TaskEvent]]:
    store = SQLiteStorage.from_url(url)
    await store.open()
    try:
        tasks = await store.query(TaskFilter(dedupe_key="same"), limit=1000)
        events, _ = await store.read_events(position_token(0), limit=1000)
    finally:
        await store.close()
    return tasks, events


@pytest.mark.slow
def test_concurrent_enqueues_of_one_key_from_processes_yield_one_leader(tmp_path: Path):
    url = url_of(tmp_path / "dedupe.db")
    asyncio.run(_create(url))  # the schema exists before the processes race
    processes, each = 4, 25
    lasts = run_together(_ENQUEUER, url, str(each), processes=processes)
    reported = [row for last in lasts for row in json.loads(last)]
    assert len(reported) == processes * each

    tasks, events = asyncio.run(_read_back(url))
    assert len(tasks) == processes * each
    leaders = [t for t in tasks if t.alias_of is None]
    assert len(leaders) == 1
    (leader,) = leaders
    assert all(t.alias_of == leader.id for t in tasks if t.id != leader.id)
    assert {t.id: t.alias_of for t in tasks} == {row[0]: row[1] for row in reported}

    # Cursors follow commit order across processes: each enqueue's event lies after the
    # cursor its process saw before the call and at or before the one it saw after.
    enqueued = {e.task.id: e.cursor for e in events if e.kind is EventKind.ENQUEUED}
    assert len(enqueued) == processes * each
    for task_id, _, before, after in reported:
        assert before < enqueued[task_id] <= after
    assert min(enqueued, key=enqueued.__getitem__) == leader.id  # the first commit leads


# -- the claim statement under suspensions ----------------------------------------------------


async def test_a_claim_with_suspension_rows_still_uses_the_claim_index(store: SQLiteStorage):
    await store.enqueue(
        [
            new_task(t, app_id=app)
            for t in ("job", "other")
            for app in (None, "x", "y")
            for _ in range(30)
        ]
    )
    await store.suspend(SuspensionScope(app_id="x"))
    await store.suspend(SuspensionScope(task_type="other", app_id="y"))
    request = ClaimRequest(
        worker_id="w",
        handlers={(None, "job"): None, ("y", "job"): 5, (None, "other"): None},
        limit=100,
        lease_seconds=30,
    )
    with raw(store) as conn:
        rows = conn.execute("SELECT task_type, app_id FROM suspensions").fetchall()
        scopes = [SuspensionScope(task_type=t, app_id=a) for t, a in rows]
        statement = claim_statement(request, 0, scopes)
        assert statement is not None
        sql, params = statement
        assert "suspensions" not in sql  # folded into the shape, not tested per row
        plans = [_plan(conn, sql, params)]
        conn.execute("ANALYZE")
        plans.append(_plan(conn, sql, params))
    for plan in plans:
        assert plan.count("USING INDEX tasks_claim") == 3, plan
        assert "SCAN tasks" not in plan, plan
    # What that statement claims is what the store claims: nothing of app x, nor of
    # type "other" for app y.
    claimed = await store.claim_batch(request)
    kinds = {(t.task_type, t.app_id) for t in claimed}
    assert kinds == {("job", None), ("job", "y"), ("other", None)}


def test_a_claim_entirely_suspended_runs_no_statement():
    request = claim("a", ("x", "a"), "b")
    assert claim_statement(request, 0, [SuspensionScope()]) is None
    assert claim_statement(request, 0, [SuspensionScope("a"), SuspensionScope("b")]) is None
    # Only the host key of "b" is left: one source, no union.
    statement = claim_statement(request, 0, [SuspensionScope("a")])
    assert statement is not None and "UNION" not in statement[0]


# -- the event log -----------------------------------------------------------------------------


async def test_event_reads_and_cancel_lookups_use_indexes(store: SQLiteStorage):
    await store.enqueue([new_task() for _ in range(20)])
    _, token = await store.read_events(None)
    cursor = token_position(token)
    with raw(store) as conn:
        # One read: a rowid range of events, each joined to its task by rowid.
        sql, _ = conn.execute("SELECT sql, 0 FROM sqlite_master WHERE name = 'events'").fetchone()
        assert "AUTOINCREMENT" in sql
        read = _plan(
            conn,
            "SELECT e.seq, t.id, t.params FROM events AS e LEFT JOIN tasks AS t "
            "ON t.seq = e.task_seq AND t.id = e.task_id WHERE e.seq > ? ORDER BY e.seq LIMIT ?",
            [cursor - 5, 10],
        )
        assert "SEARCH e USING INTEGER PRIMARY KEY (rowid>?)" in read, read
        assert "SEARCH t USING INTEGER PRIMARY KEY (rowid=?)" in read, read
        assert "TEMP B-TREE" not in read, read
        children = _plan(conn, "SELECT id, parent_id FROM tasks WHERE parent_id IN (?, ?)", [1, 2])
        assert "tasks_parent" in children, children
    events, _ = await store.read_events(position_token(cursor - 5))
    assert len(events) == 5


async def test_events_of_deleted_tasks_are_skipped_even_when_their_rowid_is_reused(
    store: SQLiteStorage,
):
    _, start = await store.read_events(None)
    (old,) = await store.enqueue([new_task()])
    (running,) = await store.claim_batch(claim())
    await store.finish_batch([finish(running)])
    with raw(store) as conn:
        (old_seq,) = conn.execute("SELECT seq FROM tasks WHERE id = ?", (old.id,)).fetchone()
    assert await wait_until(lambda: store.cleanup(timedelta(0))) == 1
    (new,) = await store.enqueue([new_task()])
    with raw(store) as conn:
        (new_seq,) = conn.execute("SELECT seq FROM tasks WHERE id = ?", (new.id,)).fetchone()
        logged = conn.execute(
            "SELECT count(*) FROM events WHERE seq > ?", (token_position(start),)
        ).fetchone()
    assert new_seq == old_seq, "SQLite reuses the rowid of a deleted newest row"
    assert logged == (4,)  # the old task's three events are still stored
    events, cursor = await store.read_events(start)
    assert [(e.task.id, e.kind) for e in events] == [(new.id, EventKind.ENQUEUED)]
    assert cursor == events[0].cursor == position_token(token_position(start) + 4)
    # A page made only of skipped events still moves the cursor past them.
    assert await store.read_events(start, limit=2) == (
        [],
        position_token(token_position(start) + 2),
    )


async def test_prune_deletes_the_old_prefix_of_the_log(store: SQLiteStorage):
    await store.enqueue([new_task() for _ in range(5)])
    with raw(store) as conn:
        # The three oldest events were recorded two hours ago.
        conn.execute("UPDATE events SET at = at - 7200000000 WHERE seq <= 3")
    assert await store.prune_events(timedelta(hours=3)) == 0
    assert await store.prune_events(timedelta(hours=1)) == 3
    events, _ = await store.read_events(position_token(0))
    assert [e.cursor for e in events] == [position_token(4), position_token(5)]


# -- cancellation ------------------------------------------------------------------------------


async def test_large_selections_are_cancelled_and_watched_in_chunks(store: SQLiteStorage):
    parents = await store.enqueue([new_task("p") for _ in range(700)])
    children = await store.enqueue([new_task("c", parent_id=p.id) for p in parents])
    running = await store.claim_batch(claim("p", limit=600))
    assert len(running) == 600
    leases = [lease_of(t) for t in running]
    assert await store.watch_leases(leases) == {t.id: None for t in running}

    asked = await store.cancel(filter=TaskFilter(task_types=("p",)), reason=CancelReason.SHUTDOWN)
    assert {t.id for t in asked} == {t.id for t in running}
    assert set((await store.watch_leases(leases)).values()) == {CancelReason.SHUTDOWN}

    changed = await store.cancel(filter=TaskFilter(task_types=("p",)), reason=CancelReason.USER)
    assert len(changed) == 1400
    assert [t.id for t in changed[:700]] == [p.id for p in parents]
    assert [t.id for t in changed[700:]] == [c.id for c in children]
    assert await store.watch_leases(leases) == {}
    summary = await store.summary(TaskFilter())
    assert summary.cancelled == 1400
    assert (await store.attempts(running[599].id))[0].outcome is AttemptOutcome.CANCELLED


async def test_a_cancelled_leader_frees_its_dedupe_key_in_the_database(store: SQLiteStorage):
    (leader,) = await store.enqueue([new_task("t", dedupe_key="k")])
    (running,) = await store.claim_batch(claim("t"))
    (alias,) = await store.enqueue([new_task("t", dedupe_key="k")])
    changed = await store.cancel(task_ids=[leader.id], reason=CancelReason.PREEMPTED)
    assert [t.id for t in changed] == [leader.id, alias.id]
    assert changed[1].cancel_reason is CancelReason.PREEMPTED
    with raw(store) as conn:  # nothing holds the key in tasks_dedupe_leader any more
        active = conn.execute(
            "SELECT count(*) FROM tasks WHERE dedupe_key = 'k' AND status IN ('pending', 'running')"
        ).fetchone()
    assert active == (0,)
    (fresh,) = await store.enqueue([new_task("t", dedupe_key="k")])
    assert fresh.alias_of is None
    assert await store.finish_batch([finish(running)]) == [None]


async def test_cascade_reaches_the_children_of_selected_aliases(store: SQLiteStorage):
    (leader,) = await store.enqueue([new_task("t", dedupe_key="k")])
    (alias,) = await store.enqueue([new_task("t", dedupe_key="k")])
    (child,) = await store.enqueue([new_task("c", parent_id=alias.id)])
    (grandchild,) = await store.enqueue([new_task("g", parent_id=child.id)])
    # The filter selects the leader and then its alias; cancelling the leader settles
    # the alias first, and the alias, being selected, still cascades to its children.
    changed = await store.cancel(filter=TaskFilter(dedupe_key="k"), reason=CancelReason.USER)
    assert [t.id for t in changed] == [leader.id, alias.id, child.id, grandchild.id]
    assert all(t.status is TaskStatus.CANCELLED for t in changed)
    # Without cascade, or when only the leader is selected, the alias's child stays.
    (leader2,) = await store.enqueue([new_task("t", dedupe_key="k")])
    (alias2,) = await store.enqueue([new_task("t", dedupe_key="k")])
    (child2,) = await store.enqueue([new_task("c", parent_id=alias2.id)])
    changed = await store.cancel(task_ids=[leader2.id], reason=CancelReason.USER)
    assert [t.id for t in changed] == [leader2.id, alias2.id]
    current = await store.get(child2.id)
    assert current is not None and current.status is TaskStatus.PENDING


def _state(task: Task) -> tuple:
    return (
        task.id,
        task.status,
        task.cancel_reason,
        task.error,
        task.result,
        task.alias_of,
        task.attempts,
        task.worker_id,
        task.finished_at is not None,
    )


@pytest.mark.parametrize("seed", [20240612, 1, 2, 3])
async def test_control_matches_the_reference_store(store: SQLiteStorage, seed: int):
    """Random task trees with dedupe keys, claims, finishes, suspensions and cancels:
    the SQLite store changes exactly what the in-memory reference changes, in the same
    order, and records the same events."""
    rng = random.Random(seed)
    memory = MemoryStorage()
    await memory.open()
    stores: tuple[TaskStorage, TaskStorage] = (memory, store)
    _, mem_start = await memory.read_events(None)
    _, sql_start = await store.read_events(None)
    ids: list[str] = []
    # Parents are never dedupe tasks: the reference does not cascade from a selected
    # alias settled by its leader first (test_cascade_reaches_the_children_of_aliases).
    parents: list[str] = []
    scopes = [
        SuspensionScope(),
        SuspensionScope(task_type="a"),
        SuspensionScope(app_id="x"),
        SuspensionScope(task_type="b", app_id="x"),
    ]
    for round_ in range(40):
        specs: list[NewTask] = []
        for _ in range(rng.randint(0, 8)):
            specs.append(
                new_task(
                    rng.choice(["a", "b"]),
                    {"r": round_},
                    app_id=rng.choice([None, "x"]),
                    dedupe_key=rng.choice([None, None, "k1", "k2"]),
                    parent_id=rng.choice([None, *parents[-6:]]),
                )
            )
        if specs:
            for s in stores:
                await s.enqueue(specs)
            ids += [spec.id for spec in specs]
            parents += [spec.id for spec in specs if spec.dedupe_key is None]
        if rng.random() < 0.2:
            scope = rng.choice(scopes)
            if rng.random() < 0.6:
                asked = [await s.suspend(scope) for s in stores]
            else:
                asked = [int(await s.resume(scope)) for s in stores]
            assert asked[0] == asked[1], (round_, scope)
        request = claim("a", "b", ("x", "a"), worker=f"w{round_}", limit=rng.randint(0, 4))
        claimed = [await s.claim_batch(request) for s in stores]
        assert [t.id for t in claimed[0]] == [t.id for t in claimed[1]], round_
        done = [t for t in claimed[1] if rng.random() < 0.5]
        kinds = [rng.choice([FinishKind.COMPLETE, FinishKind.RETRY]) for _ in done]
        for s in stores:
            await s.finish_batch(
                [
                    finish(t, kind, result=round_, error="boom", retry_in=0)
                    for t, kind in zip(done, kinds, strict=True)
                ]
            )
        if ids and rng.random() < 0.6:
            how = rng.random()
            task_ids = rng.sample(ids, min(len(ids), rng.randint(1, 4))) if how < 0.6 else None
            filter = None
            if task_ids is None or how < 0.15:
                filter = rng.choice(
                    [
                        TaskFilter(task_types=("a",)),
                        TaskFilter(dedupe_key="k1"),
                        TaskFilter(app_id="x", statuses=(TaskStatus.RUNNING,)),
                    ]
                )
            reason = rng.choice(list(CancelReason))
            cascade = rng.random() < 0.7
            before = {t.id: _state(t) for t in await store.query(TaskFilter(), limit=10_000)}
            changed = [
                [
                    _state(t)
                    for t in await s.cancel(
                        task_ids=task_ids, filter=filter, reason=reason, cascade=cascade
                    )
                ]
                for s in stores
            ]
            # Every task SQLite returns did change. (The reference also returns the
            # aliases of a cancelled leader that were cancelled on their own earlier,
            # unchanged: drop those from its list.)
            assert all(before[state[0]] != state for state in changed[1]), round_
            expected = [state for state in changed[0] if before[state[0]] != state]
            assert expected == changed[1], round_
        states = [[_state(t) for t in await s.query(TaskFilter(), limit=10_000)] for s in stores]
        assert states[0] == states[1], round_
        assert await memory.suspensions() == await store.suspensions()
    for task_id in ids:
        logs = [[(a.number, a.outcome, a.error) for a in await s.attempts(task_id)] for s in stores]
        assert logs[0] == logs[1], task_id
    mem_events, _ = await memory.read_events(mem_start, limit=100_000)
    sql_events, _ = await store.read_events(sql_start, limit=100_000)
    # Per task, the same events in the same order (within one operation the order of
    # different tasks' events may differ: the reference suspends in set order).
    per_task: tuple[dict[str, list], dict[str, list]] = ({}, {})
    for log, events in zip(per_task, (mem_events, sql_events), strict=True):
        for e in events:
            log.setdefault(e.task.id, []).append((e.kind, e.status))
    assert per_task[0] == per_task[1]
    assert len(mem_events) == len(sql_events)
    summary = await store.summary(TaskFilter())
    assert summary.cancelled > 0 and summary.completed > 0  # the run exercised both
