"""Contract: the event log (SPEC 5.10).

Cursors are opaque tokens: the suite compares them only as the contract allows (for
equality, and with ``<`` between tokens of one store, which orders them as the events
committed), never by their values or as numbers.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from taskmill.errors import InvalidCursor
from taskmill.model import CancelReason, EventKind, Progress, TaskEvent, TaskStatus
from taskmill.storage import FinishKind, ProgressUpdate, TaskStorage
from taskmill.testing.helpers import claim, finish, lease_of, new_task, wait_until

__all__ = ["EventContract", "read_all_events"]


async def read_all_events(
    storage: TaskStorage, after: str | None, *, limit: int = 1000
) -> list[TaskEvent]:
    """Every event after cursor ``after``, read page by page (``limit`` a page)."""
    events: list[TaskEvent] = []
    cursor = after
    while True:
        page, next_cursor = await storage.read_events(cursor, limit=limit)
        events += page
        if next_cursor == cursor:
            return events
        cursor = next_cursor


class EventContract:
    """Every change appends an event, in the order the changes were made."""

    async def test_every_change_is_in_the_event_log_in_order(self, storage: TaskStorage) -> None:
        _, start = await storage.read_events(None)
        (task,) = await storage.enqueue([new_task()])
        (running,) = await storage.claim_batch(claim())
        await storage.save_progress(
            [ProgressUpdate(lease=lease_of(running), progress=Progress(1, 2))]
        )
        await storage.finish_batch([finish(running, FinishKind.RETRY, error="x")])
        (again,) = await storage.claim_batch(claim())
        await storage.finish_batch([finish(again, result="ok")])
        events, end = await storage.read_events(start)
        mine = [e for e in events if e.task.id == task.id]
        assert [(e.kind, e.status) for e in mine] == [
            (EventKind.ENQUEUED, TaskStatus.PENDING),
            (EventKind.STARTED, TaskStatus.RUNNING),
            (EventKind.PROGRESS, TaskStatus.RUNNING),
            (EventKind.RETRYING, TaskStatus.PENDING),
            (EventKind.STARTED, TaskStatus.RUNNING),
            (EventKind.COMPLETED, TaskStatus.COMPLETED),
        ]
        assert all(e.at.tzinfo is not None for e in events)
        # The snapshot is the task as it is now; status is what each change produced.
        assert {e.task.status for e in mine} == {TaskStatus.COMPLETED}
        cursors = [e.cursor for e in events]
        assert len(set(cursors)) == len(cursors)
        assert end == cursors[-1]
        assert await storage.read_events(end) == ([], end)

    async def test_cursors_are_tokens_ordered_as_the_events_committed(
        self, storage: TaskStorage
    ) -> None:
        _, start = await storage.read_events(None)
        for _ in range(12):  # past one digit, where a variable-width number misorders
            (task,) = await storage.enqueue([new_task()])
            await storage.cancel(task_ids=[task.id])
        events = await read_all_events(storage, start, limit=5)
        cursors = [e.cursor for e in events]
        assert len(cursors) == 24
        for token in [start, *cursors]:
            assert isinstance(token, str) and token and "." not in token
        assert all(a < b for a, b in zip([start, *cursors], cursors, strict=False))
        _, now = await storage.read_events(None)
        assert now == cursors[-1]
        # A page that reads nothing hands back the cursor it was given.
        assert await storage.read_events(start, limit=0) == ([], start)

    async def test_a_cursor_the_store_did_not_write_is_refused(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task()])
        _, mine = await storage.read_events(None)
        for foreign in ("", "not a cursor", f"{mine}.1", "-1"):
            with pytest.raises(InvalidCursor, match="read_events"):
                await storage.read_events(foreign)
            with pytest.raises(InvalidCursor):
                await storage.read_events(foreign, limit=0)

    async def test_the_event_log_reads_in_pages_that_join_up(self, storage: TaskStorage) -> None:
        _, start = await storage.read_events(None)
        await storage.enqueue([new_task() for _ in range(5)])
        first, cursor = await storage.read_events(start, limit=3)
        rest, end = await storage.read_events(cursor, limit=10)
        assert len(first) == 3 and len(rest) == 2
        assert cursor == first[-1].cursor and end == rest[-1].cursor
        whole, _ = await storage.read_events(start, limit=10)
        assert [e.cursor for e in whole] == [e.cursor for e in first + rest]

    @pytest.mark.parametrize("n", [1, 9, 129, 300])
    async def test_a_batch_records_one_event_per_task_in_order(
        self, storage: TaskStorage, n: int
    ) -> None:
        _, start = await storage.read_events(None)
        tasks = await storage.enqueue([new_task() for _ in range(n)])
        claimed = await storage.claim_batch(claim(limit=n))
        results = await storage.finish_batch([finish(t) for t in claimed])
        events = await read_all_events(storage, start, limit=100)
        assert [(e.kind, e.task.id) for e in events] == [
            *((EventKind.ENQUEUED, t.id) for t in tasks),
            *((EventKind.STARTED, t.id) for t in claimed),
            *((EventKind.COMPLETED, t.id) for t in results if t is not None),
        ]
        whole, _ = await storage.read_events(start, limit=10 * n)
        assert [e.cursor for e in whole] == [e.cursor for e in events]

    async def test_cancellations_rescues_and_aliases_emit_events(
        self, storage: TaskStorage
    ) -> None:
        _, start = await storage.read_events(None)
        (leader,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        (alias,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        await storage.cancel(task_ids=[leader.id], reason=CancelReason.USER)
        await storage.enqueue([new_task("r")])
        await storage.claim_batch(claim("r", lease=0.05))
        await wait_until(storage.rescue_expired)
        events, _ = await storage.read_events(start)
        kinds = [(e.task.id, e.kind) for e in events]
        assert (leader.id, EventKind.CANCELLED) in kinds
        assert (alias.id, EventKind.CANCELLED) in kinds
        assert EventKind.REQUEUED in [e.kind for e in events if e.task.task_type == "r"]

    async def test_aliases_settled_with_their_leader_have_its_terminal_event(
        self, storage: TaskStorage
    ) -> None:
        _, start = await storage.read_events(None)
        (leader,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        first, second = await storage.enqueue(
            [new_task("t", dedupe_key="k"), new_task("t", dedupe_key="k")]
        )
        (running,) = await storage.claim_batch(claim("t"))
        await storage.finish_batch([finish(running, result={"n": 1})])
        events, _ = await storage.read_events(start)
        tail = [(e.task.id, e.kind, e.status) for e in events[-3:]]
        assert tail == [
            (leader.id, EventKind.COMPLETED, TaskStatus.COMPLETED),
            (first.id, EventKind.COMPLETED, TaskStatus.COMPLETED),
            (second.id, EventKind.COMPLETED, TaskStatus.COMPLETED),
        ]
        assert all(e.task.result == {"n": 1} for e in events[-3:])

    async def test_rescue_and_redrive_record_their_events(self, storage: TaskStorage) -> None:
        _, start = await storage.read_events(None)
        await storage.enqueue([new_task(max_retries=0)])
        (running,) = await storage.claim_batch(claim(lease=0.05))
        (failed,) = await wait_until(storage.rescue_expired)
        assert failed.status is TaskStatus.FAILED
        await storage.retry(running.id)
        events, _ = await storage.read_events(start)
        assert [(e.kind, e.status) for e in events] == [
            (EventKind.ENQUEUED, TaskStatus.PENDING),
            (EventKind.STARTED, TaskStatus.RUNNING),
            (EventKind.FAILED, TaskStatus.FAILED),
            (EventKind.REQUEUED, TaskStatus.PENDING),
        ]

    async def test_a_new_subscriber_starts_after_everything_committed(
        self, storage: TaskStorage
    ) -> None:
        _, empty = await storage.read_events(None)
        assert await storage.read_events(empty) == ([], empty)
        await storage.enqueue([new_task()])
        _, start = await storage.read_events(None)
        (task,) = await storage.enqueue([new_task()])
        events, _ = await storage.read_events(start)
        assert [e.task.id for e in events] == [task.id]

        async def everything_pruned() -> bool:
            await storage.prune_events(timedelta(0))
            events, _ = await storage.read_events(empty)
            return not events

        await wait_until(everything_pruned)
        # With every event pruned, a new subscriber still starts after them, and an old
        # cursor still reads only what came after it.
        _, after_prune = await storage.read_events(None)
        (later,) = await storage.enqueue([new_task()])
        for cursor in (after_prune, start, empty):
            events, _ = await storage.read_events(cursor)
            assert [e.task.id for e in events] == [later.id]

    async def test_events_of_deleted_tasks_are_skipped(self, storage: TaskStorage) -> None:
        _, start = await storage.read_events(None)
        await storage.enqueue([new_task("gone")])
        (task,) = await storage.claim_batch(claim("gone"))
        await storage.finish_batch([finish(task)])
        (kept,) = await storage.enqueue([new_task("kept")])
        assert await wait_until(lambda: storage.cleanup(timedelta(0))) == 1
        events, cursor = await storage.read_events(start)
        assert [e.task.id for e in events] == [kept.id]
        assert cursor == events[-1].cursor

    async def test_old_events_are_pruned(self, storage: TaskStorage) -> None:
        _, start = await storage.read_events(None)
        await storage.enqueue([new_task()])
        assert await storage.prune_events(timedelta(hours=1)) == 0
        assert await wait_until(lambda: storage.prune_events(timedelta(0))) >= 1
        events, _ = await storage.read_events(start)
        assert events == []
