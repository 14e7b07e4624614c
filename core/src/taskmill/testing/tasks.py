"""Contract: storing and reading tasks (SPEC 3, 5.14): enqueue, get, query, summary,
retention, durability and timestamps."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from taskmill.errors import StorageUnavailable
from taskmill.model import Priority, Progress, TaskFilter, TaskStatus
from taskmill.storage import FinishKind, TaskStorage, utcnow
from taskmill.testing.capabilities import requires
from taskmill.testing.fixtures import StorageFactory
from taskmill.testing.helpers import claim, finish, moment_after, new_task, wait_until

__all__ = ["TaskContract"]


class TaskContract:
    """What is stored is what is read back, selected and counted as asked."""

    async def test_enqueue_returns_pending_snapshots_in_order(self, storage: TaskStorage) -> None:
        specs = [new_task("a", {"n": i}) for i in range(5)]
        stored = await storage.enqueue(specs)
        assert [t.id for t in stored] == [s.id for s in specs]
        for task, spec in zip(stored, specs, strict=True):
            assert task.status is TaskStatus.PENDING
            assert task.params == spec.params
            assert task.attempts == 0
            assert task.worker_id is None
            assert task.created_at.tzinfo is not None

    async def test_get_returns_the_stored_task_with_every_field(self, storage: TaskStorage) -> None:
        when = utcnow() + timedelta(hours=1)
        spec = new_task(
            "resize",
            {"path": "a.png", "sizes": [1, 2], "nested": {"ok": True}},
            app_id="photos",
            priority=Priority.URGENT,
            max_retries=7,
            run_at=when,
            dedupe_key="k",
            parent_id=None,
            user_id="alice",
        )
        (stored,) = await storage.enqueue([spec])
        task = await storage.get(spec.id)
        assert task == stored
        assert task.task_type == "resize"
        assert task.app_id == "photos"
        assert task.params == {"path": "a.png", "sizes": [1, 2], "nested": {"ok": True}}
        assert task.priority == Priority.URGENT
        assert task.max_retries == 7
        assert task.user_id == "alice"
        assert task.dedupe_key == "k"
        assert abs((task.run_at - when).total_seconds()) < 0.001
        assert task.run_at.utcoffset() == timedelta(0)

    async def test_a_closed_store_refuses_operations_and_close_is_idempotent(
        self, storage: TaskStorage
    ) -> None:
        (task,) = await storage.enqueue([new_task()])
        await storage.close()
        await storage.close()
        with pytest.raises(StorageUnavailable, match="not open"):
            await storage.get(task.id)
        with pytest.raises(StorageUnavailable, match="not open"):
            await storage.enqueue([new_task()])
        await storage.open()
        await storage.open()  # opening twice is harmless
        assert await storage.get(task.id) == task

    async def test_get_unknown_id_is_none(self, storage: TaskStorage) -> None:
        assert await storage.get(str(uuid.uuid4())) is None

    async def test_unicode_and_large_params_round_trip(self, storage: TaskStorage) -> None:
        params = {"text": "zażółć 🐍 " * 1000, "n": 2**53, "f": 0.1}
        (task,) = await storage.enqueue([new_task("a", params)])
        fetched = await storage.get(task.id)
        assert fetched is not None and fetched.params == params

    async def test_query_filters(self, storage: TaskStorage) -> None:
        (parent,) = await storage.enqueue([new_task("p")])
        await storage.enqueue(
            [
                new_task("a", app_id="x", user_id="u1", parent_id=parent.id),
                new_task("b", app_id="y", user_id="u2", dedupe_key="d"),
                new_task("a", app_id="y"),
            ]
        )

        async def types(f: TaskFilter) -> list[str]:
            return [t.task_type for t in await storage.query(f)]

        assert await types(TaskFilter(app_id="y")) == ["b", "a"]
        assert await types(TaskFilter(task_types=("a",))) == ["a", "a"]
        assert await types(TaskFilter(user_id="u1")) == ["a"]
        assert await types(TaskFilter(parent_id=parent.id)) == ["a"]
        assert await types(TaskFilter(dedupe_key="d")) == ["b"]
        assert await types(TaskFilter(statuses=(TaskStatus.RUNNING,))) == []
        assert len(await storage.query(TaskFilter(statuses=(TaskStatus.PENDING,)))) == 4

    async def test_query_time_window_limit_offset_and_order(self, storage: TaskStorage) -> None:
        first = await storage.enqueue([new_task(params={"i": i}) for i in range(3)])
        middle = await moment_after(max(t.created_at for t in first))
        await moment_after(middle)
        second = await storage.enqueue([new_task(params={"i": i}) for i in range(3, 5)])
        ids = [t.id for t in first + second]
        assert [t.id for t in await storage.query(TaskFilter())] == ids
        window = await storage.query(TaskFilter(), limit=2, offset=1)
        assert [t.id for t in window] == ids[1:3]
        newest = await storage.query(TaskFilter(), newest_first=True, limit=2)
        assert [t.id for t in newest] == ids[::-1][:2]
        after = await storage.query(TaskFilter(created_after=middle))
        assert [t.id for t in after] == [t.id for t in second]
        before = await storage.query(TaskFilter(created_before=middle))
        assert [t.id for t in before] == [t.id for t in first]

    async def test_summary_counts_by_status(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task() for _ in range(6)])
        a, b, _c = await storage.claim_batch(claim(limit=3))
        await storage.finish_batch([finish(a), finish(b, FinishKind.FAIL, error="x")])
        summary = await storage.summary(TaskFilter())
        assert (summary.total, summary.pending, summary.running) == (6, 3, 1)
        assert (summary.completed, summary.failed, summary.cancelled) == (1, 1, 0)
        assert summary.pct == pytest.approx(100 * 2 / 6)
        assert (await storage.summary(TaskFilter(task_types=("none",)))).total == 0

    async def test_cleanup_deletes_old_terminal_tasks_and_their_log(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task() for _ in range(3)])
        done, failed, _running = await storage.claim_batch(claim(limit=3))
        await storage.finish_batch([finish(done), finish(failed, FinishKind.FAIL, error="x")])
        (pending,) = await storage.enqueue([new_task()])
        assert await storage.cleanup(timedelta(hours=1)) == 0
        # cleanup(0) takes what finished strictly before now: wait for the clock to move.
        assert await wait_until(lambda: storage.cleanup(timedelta(0))) == 1
        assert await storage.get(done.id) is None
        assert await storage.attempts(done.id) == []
        assert await storage.get(failed.id) is not None
        assert await storage.get(pending.id) is not None
        deleted = await storage.cleanup(timedelta(0), statuses=frozenset({TaskStatus.FAILED}))
        assert deleted == 1
        with pytest.raises(ValueError, match="terminal"):
            await storage.cleanup(timedelta(0), statuses=frozenset({TaskStatus.PENDING}))

    async def test_timestamps_are_timezone_aware_utc(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task()])
        (task,) = await storage.claim_batch(claim())
        (done,) = await storage.finish_batch([finish(task)])
        assert done is not None
        for value in (
            done.created_at,
            done.run_at,
            done.updated_at,
            done.started_at,
            done.finished_at,
        ):
            assert value is not None
            assert value.utcoffset() == timedelta(0)
            assert abs((value - datetime.now(UTC)).total_seconds()) < 60

    async def test_query_pages_newest_first_and_filters_by_status_and_app(
        self, storage: TaskStorage
    ) -> None:
        tasks = await storage.enqueue(
            [new_task("t", {"i": i}, app_id="a" if i % 2 else None) for i in range(10)]
        )
        await storage.claim_batch(claim(("a", "t"), limit=2))
        newest = await storage.query(TaskFilter(), newest_first=True, limit=3, offset=2)
        assert [t.id for t in newest] == [t.id for t in tasks[::-1][2:5]]
        running = await storage.query(TaskFilter(app_id="a", statuses=(TaskStatus.RUNNING,)))
        assert [t.id for t in running] == [tasks[1].id, tasks[3].id]
        assert await storage.query(TaskFilter(task_types=())) == []
        assert await storage.query(TaskFilter(), limit=0) == []
        summary = await storage.summary(TaskFilter(app_id="a"))
        assert (summary.total, summary.running, summary.pending) == (5, 2, 3)

    async def test_keyset_pages_after_a_task_cover_every_task_once_in_either_order(
        self, storage: TaskStorage
    ) -> None:
        first = await storage.enqueue([new_task("t", {"i": i}) for i in range(7)])
        second = await storage.enqueue([new_task("u", {"i": i}) for i in range(6)])
        everything = [t.id for t in first + second]
        for newest_first, expected in ((False, everything), (True, everything[::-1])):
            seen: list[str] = []
            after: str | None = None
            while True:
                page = await storage.query(
                    TaskFilter(), limit=4, newest_first=newest_first, after=after
                )
                if not page:
                    break
                seen += [t.id for t in page]
                after = page[-1].id
            assert seen == expected
        # The position is the task's, whatever the filter; tasks added later do not
        # shift a page that starts before them.
        later = await storage.enqueue([new_task("t")])
        page = await storage.query(
            TaskFilter(task_types=("t",)), newest_first=True, after=second[2].id, limit=100
        )
        assert [t.id for t in page] == [t.id for t in first[::-1]]
        assert later[0].id not in [t.id for t in page]
        assert await storage.query(TaskFilter(), after=str(uuid.uuid4())) == []

    async def test_text_selects_tasks_whose_id_or_dedupe_key_contains_it(
        self, storage: TaskStorage
    ) -> None:
        keyed = await storage.enqueue(
            [
                new_task("t", dedupe_key="invoice-x2026-Q4"),
                new_task("t", dedupe_key="INVOICE-x2026"),
                new_task("u", dedupe_key="receipt-7"),
            ]
        )
        plain = (await storage.enqueue([new_task("t")]))[0]

        async def ids(**fields: object) -> set[str]:
            found = await storage.query(TaskFilter(**fields), limit=100)  # type: ignore[arg-type]
            return {t.id for t in found}

        assert await ids(text="invoice") == {keyed[0].id}  # case-sensitive
        # (texts with letters beyond hex, so that no random id contains them)
        assert await ids(text="x2026") == {keyed[0].id, keyed[1].id}
        assert await ids(text="x2026", task_types=("u",)) == set()
        assert await ids(text=plain.id[9:23]) == {plain.id}  # part of an id
        assert await ids(text="%") == set() and await ids(text="_") == set()  # no wildcards
        assert await ids(text="") == {t.id for t in [*keyed, plain]}
        summary = await storage.summary(TaskFilter(text="receipt"))
        assert summary.total == 1

    @requires("durable")
    async def test_what_was_committed_survives_close_and_reopen(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        tasks = await storage.enqueue(
            [new_task(params={"i": i}, dedupe_key=f"k{i}") for i in range(5)]
        )
        claimed = await storage.claim_batch(claim(limit=2))
        done, _ = await storage.finish_batch(
            [
                finish(claimed[0], result={"ok": True}, progress=Progress(1, 1, "done")),
                finish(claimed[1], FinishKind.RETRY, error="again", retry_in=60),
            ]
        )
        before = [await storage.get(t.id) for t in tasks]
        log_before = [await storage.attempts(t.id) for t in tasks]
        await storage.close()

        reopened = await storage_factory()
        assert [await reopened.get(t.id) for t in tasks] == before
        assert [await reopened.attempts(t.id) for t in tasks] == log_before
        assert done is not None and await reopened.get(done.id) == done
        summary = await reopened.summary(TaskFilter())
        assert (summary.pending, summary.completed) == (4, 1)

    async def test_a_change_listener_exists_exactly_when_notifications_are_declared(
        self, storage: TaskStorage
    ) -> None:
        listener = await storage.change_listener()
        try:
            assert (listener is not None) is storage.capabilities.notifications
        finally:
            if listener is not None:
                await listener.close()
