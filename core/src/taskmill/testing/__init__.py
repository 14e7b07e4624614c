"""The storage contract suite, shipped with the core.

A backend proves it implements :class:`taskmill.TaskStorage` by subclassing
:class:`StorageContract` and providing a ``storage`` fixture that yields an opened,
empty store::

    from taskmill.testing import StorageContract

    class TestMyBackend(StorageContract):
        @pytest.fixture
        async def storage(self):
            store = MyStorage.from_url("my://...")
            await store.open()
            yield store
            await store.close()

The tests need pytest-asyncio. Every test is a statement of the semantics in SPEC
section 5; a backend that lacks a capability declares it in ``capabilities`` and the
tests that need it are skipped with that reason, never silently.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from taskmill.errors import InvalidTransition, StorageUnavailable, TaskNotFound
from taskmill.model import (
    AttemptOutcome,
    CancelReason,
    Priority,
    Progress,
    TaskFilter,
    TaskStatus,
)
from taskmill.storage import (
    Finish,
    FinishKind,
    Lease,
    ProgressUpdate,
    TaskStorage,
    utcnow,
)
from taskmill.testing.control import ControlContract
from taskmill.testing.helpers import claim, finish, lease_of, new_task, wait_until
from taskmill.testing.lifecycle import LifecycleContract
from taskmill.testing.reference import ReferenceContract
from taskmill.testing.registrations import HandlerRegistrationContract

__all__ = ["StorageContract", "claim", "finish", "lease_of", "new_task", "wait_until"]


class StorageContract(
    ControlContract, ReferenceContract, HandlerRegistrationContract, LifecycleContract
):
    """The semantics every :class:`~taskmill.TaskStorage` must have.

    Subclass it and provide an async ``storage`` fixture yielding an opened, empty store.
    """

    pytestmark = pytest.mark.asyncio

    @pytest.fixture
    def storage(self) -> TaskStorage:
        raise NotImplementedError("a backend's contract test class provides `storage`")

    # -- enqueue and read -------------------------------------------------------

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

    # -- claiming ---------------------------------------------------------------

    async def test_claim_orders_by_priority_then_creation(self, storage: TaskStorage) -> None:
        low = await storage.enqueue([new_task(priority=Priority.BACKGROUND)])
        normal = await storage.enqueue([new_task(), new_task()])
        urgent = await storage.enqueue([new_task(priority=Priority.URGENT)])
        claimed = await storage.claim_batch(claim(limit=10))
        assert [t.id for t in claimed] == [t.id for t in urgent + normal + low]

    async def test_claim_sets_running_worker_lease_and_counts_the_attempt(
        self, storage: TaskStorage
    ) -> None:
        (task,) = await storage.enqueue([new_task()])
        before = utcnow()
        (claimed,) = await storage.claim_batch(claim(worker="w-7", lease=30))
        assert claimed.id == task.id
        assert claimed.status is TaskStatus.RUNNING
        assert claimed.worker_id == "w-7"
        assert claimed.attempts == 1
        assert claimed.started_at is not None
        assert claimed.lease_expires_at is not None
        assert claimed.lease_expires_at >= before + timedelta(seconds=29)
        assert await storage.get(task.id) == claimed

    async def test_claim_respects_limit(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task() for _ in range(7)])
        assert len(await storage.claim_batch(claim(limit=3))) == 3
        assert len(await storage.claim_batch(claim(limit=10))) == 4
        assert await storage.claim_batch(claim(limit=10)) == []

    async def test_claim_takes_only_registered_types(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task("mine"), new_task("other")])
        claimed = await storage.claim_batch(claim("mine"))
        assert [t.task_type for t in claimed] == ["mine"]
        other = await storage.query(TaskFilter(task_types=("other",)))
        assert other[0].status is TaskStatus.PENDING

    async def test_claim_skips_tasks_not_yet_due(self, storage: TaskStorage) -> None:
        later = utcnow() + timedelta(hours=1)
        await storage.enqueue([new_task(run_at=later)])
        (due,) = await storage.enqueue([new_task(run_at=utcnow() - timedelta(seconds=1))])
        assert [t.id for t in await storage.claim_batch(claim())] == [due.id]

    async def test_claim_with_min_priority_takes_only_high_priority(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task(priority=Priority.NORMAL)])
        (high,) = await storage.enqueue([new_task(priority=Priority.USER_ACTION)])
        claimed = await storage.claim_batch(claim(min_priority=Priority.USER_ACTION))
        assert [t.id for t in claimed] == [high.id]
        assert await storage.claim_batch(claim(min_priority=Priority.USER_ACTION)) == []

    async def test_claim_honours_a_handler_cap(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task("capped", priority=200) for _ in range(5)])
        await storage.enqueue([new_task("free") for _ in range(5)])
        claimed = await storage.claim_batch(
            claim("capped", "free", limit=6, caps={(None, "capped"): 2})
        )
        types = [t.task_type for t in claimed]
        assert types.count("capped") == 2
        assert types.count("free") == 4

    async def test_app_handler_takes_precedence_over_host_handler(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue(
            [
                new_task("thumb", app_id="photos"),
                new_task("thumb", app_id="docs"),
                new_task("thumb"),
            ]
        )
        only_photos = await storage.claim_batch(claim(("photos", "thumb")))
        assert [t.app_id for t in only_photos] == ["photos"]
        host = await storage.claim_batch(claim("thumb"))
        assert sorted(str(t.app_id) for t in host) == ["None", "docs"]

    async def test_host_handler_cap_does_not_count_app_handler_tasks(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task("t", app_id="a") for _ in range(3)])
        await storage.enqueue([new_task("t") for _ in range(3)])
        claimed = await storage.claim_batch(claim("t", ("a", "t"), limit=10, caps={(None, "t"): 1}))
        apps = [t.app_id for t in claimed]
        assert apps.count("a") == 3
        assert apps.count(None) == 1

    async def test_an_app_handler_at_its_cap_does_not_fall_back_to_the_host_handler(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task("t", app_id="a") for _ in range(3)])
        await storage.enqueue([new_task("t") for _ in range(2)])
        claimed = await storage.claim_batch(claim("t", ("a", "t"), limit=10, caps={("a", "t"): 0}))
        assert [t.app_id for t in claimed] == [None, None]

    async def test_a_task_is_claimed_by_one_worker_only(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task() for _ in range(50)])
        batches = await asyncio.gather(
            *(storage.claim_batch(claim(worker=f"w{i}", limit=7)) for i in range(10))
        )
        ids = [t.id for batch in batches for t in batch]
        assert len(ids) == 50
        assert len(set(ids)) == 50
        for i, batch in enumerate(batches):
            assert all(t.worker_id == f"w{i}" for t in batch)

    # -- finishing --------------------------------------------------------------

    async def test_complete_stores_result_clears_lease_and_logs_the_attempt(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task()])
        (task,) = await storage.claim_batch(claim())
        (done,) = await storage.finish_batch(
            [finish(task, result={"ok": [1, 2]}, data={"seen": 3}, progress=Progress(3, 3, "done"))]
        )
        assert done is not None
        assert done.status is TaskStatus.COMPLETED
        assert done.result == {"ok": [1, 2]}
        assert done.data == {"seen": 3}
        assert done.progress == Progress(3, 3, "done")
        assert done.finished_at is not None
        assert done.worker_id is None and done.lease_expires_at is None
        assert await storage.get(task.id) == done
        (attempt,) = await storage.attempts(task.id)
        assert attempt.number == 1
        assert attempt.worker_id == "w1"
        assert attempt.outcome is AttemptOutcome.COMPLETED
        assert attempt.elapsed_ms >= 0

    async def test_finish_batch_applies_many_in_one_call(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task() for _ in range(20)])
        claimed = await storage.claim_batch(claim(limit=20))
        results = await storage.finish_batch([finish(t, result=i) for i, t in enumerate(claimed)])
        assert [r.result for r in results if r] == list(range(20))
        summary = await storage.summary(TaskFilter())
        assert summary.completed == 20

    async def test_finish_with_a_lost_lease_changes_nothing(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task()])
        (task,) = await storage.claim_batch(claim(worker="owner"))
        imposter = Lease(task_id=task.id, worker_id="other", attempt=task.attempts)
        stale = Lease(task_id=task.id, worker_id="owner", attempt=task.attempts - 1)
        now = utcnow()
        for lease in (imposter, stale):
            result = await storage.finish_batch(
                [
                    Finish(
                        lease=lease,
                        kind=FinishKind.COMPLETE,
                        outcome=AttemptOutcome.COMPLETED,
                        started_at=now,
                        finished_at=now,
                        result_json="1",
                    )
                ]
            )
            assert result == [None]
        assert await storage.get(task.id) == task
        assert await storage.attempts(task.id) == []

    async def test_retry_requeues_with_delay_and_keeps_the_attempt(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task()])
        (task,) = await storage.claim_batch(claim())
        (retried,) = await storage.finish_batch(
            [finish(task, FinishKind.RETRY, error="boom", retry_in=3600)]
        )
        assert retried is not None
        assert retried.status is TaskStatus.PENDING
        assert retried.attempts == 1
        assert retried.error == "boom"
        assert retried.run_at > utcnow() + timedelta(minutes=59)
        assert await storage.claim_batch(claim()) == []
        (attempt,) = await storage.attempts(task.id)
        assert attempt.outcome is AttemptOutcome.FAILED and attempt.error == "boom"

    async def test_retry_with_no_delay_is_claimable_again(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task()])
        (task,) = await storage.claim_batch(claim())
        await storage.finish_batch([finish(task, FinishKind.RETRY, error="x")])
        (again,) = await storage.claim_batch(claim())
        assert again.id == task.id and again.attempts == 2

    async def test_fail_is_the_dead_letter_state(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task()])
        (task,) = await storage.claim_batch(claim())
        (failed,) = await storage.finish_batch([finish(task, FinishKind.FAIL, error="bad input")])
        assert failed is not None
        assert failed.status is TaskStatus.FAILED
        assert failed.error == "bad input"
        assert failed.finished_at is not None
        assert await storage.claim_batch(claim()) == []

    async def test_release_requeues_without_spending_an_attempt(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task()])
        (task,) = await storage.claim_batch(claim())
        (released,) = await storage.finish_batch([finish(task, FinishKind.RELEASE)])
        assert released is not None
        assert released.status is TaskStatus.PENDING
        assert released.attempts == 0
        (again,) = await storage.claim_batch(claim(worker="w2"))
        assert again.attempts == 1
        (logged,) = await storage.attempts(task.id)
        assert logged.outcome is AttemptOutcome.INTERRUPTED

    async def test_a_requeued_task_starts_its_next_attempt_with_no_progress(
        self, storage: TaskStorage
    ) -> None:
        """A retry, a release, a failure turned into a release by a stop request and a
        rescued lease each put the task back to PENDING with its progress reset (its
        data is kept, for a handler that checkpoints); a terminal finish keeps the last
        progress of the attempt."""
        await storage.enqueue([new_task(max_retries=3) for _ in range(5)])
        retried, released, stopped, completed = await storage.claim_batch(claim(limit=4))
        (lost,) = await storage.claim_batch(claim(worker="dead", limit=1, lease=0.05))
        half = Progress(5, 10, "halfway")
        updates = [
            ProgressUpdate(lease=lease_of(t), progress=half, data={"checkpoint": 5})
            for t in (retried, released, stopped, completed, lost)
        ]
        assert len(await storage.save_progress(updates)) == 5
        await storage.cancel(task_ids=[stopped.id], reason=CancelReason.SUSPENDED)
        finished = await storage.finish_batch(
            [
                finish(retried, FinishKind.RETRY, error="boom", progress=Progress(6, 10)),
                finish(released, FinishKind.RELEASE, progress=Progress(7, 10)),
                finish(stopped, FinishKind.RETRY, error="boom", progress=Progress(8, 10)),
                finish(completed, progress=Progress(10, 10, "done")),
            ]
        )
        for task in finished[:3]:
            assert task is not None and task.status is TaskStatus.PENDING
            assert task.progress == Progress()
            assert task.data == {"checkpoint": 5}
        assert finished[3] is not None and finished[3].progress == Progress(10, 10, "done")
        await wait_until(storage.rescue_expired)
        for task_id in (retried.id, released.id, stopped.id, lost.id):
            current = await storage.get(task_id)
            assert current is not None and current.status is TaskStatus.PENDING, task_id
            assert current.progress == Progress(), task_id

    async def test_timeout_outcome_is_logged(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task()])
        (task,) = await storage.claim_batch(claim())
        await storage.finish_batch(
            [
                finish(
                    task,
                    FinishKind.RETRY,
                    error="timed out after 1s",
                    outcome=AttemptOutcome.TIMED_OUT,
                )
            ]
        )
        (attempt,) = await storage.attempts(task.id)
        assert attempt.outcome is AttemptOutcome.TIMED_OUT

    # -- leases -----------------------------------------------------------------

    async def test_renew_extends_held_leases_only(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task(), new_task()])
        a, b = await storage.claim_batch(claim(lease=5))
        await storage.finish_batch([finish(b)])
        held = await storage.renew_leases([lease_of(a), lease_of(b)], 120)
        assert held == {a.id: None}
        renewed = await storage.get(a.id)
        assert renewed is not None and renewed.lease_expires_at is not None
        assert renewed.lease_expires_at > utcnow() + timedelta(seconds=100)

    async def test_expired_lease_is_rescued_with_the_attempt_counted(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task(max_retries=2)])
        (task,) = await storage.claim_batch(claim(worker="dead", lease=0.05))
        rescued = await wait_until(storage.rescue_expired)
        assert [t.id for t in rescued] == [task.id]
        current = await storage.get(task.id)
        assert current is not None
        assert current.status is TaskStatus.PENDING
        assert current.attempts == 1
        assert current.error == "lease expired"
        assert current.worker_id is None
        (lost,) = await storage.attempts(task.id)
        assert lost.outcome is AttemptOutcome.LOST and lost.worker_id == "dead"
        assert await storage.rescue_expired() == []

    async def test_rescue_fails_a_task_that_has_no_retries_left(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task(max_retries=0)])
        (task,) = await storage.claim_batch(claim(lease=0.05))
        await wait_until(storage.rescue_expired)
        current = await storage.get(task.id)
        assert current is not None and current.status is TaskStatus.FAILED
        assert current.error == "lease expired"

    async def test_live_leases_are_not_rescued(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task()])
        (task,) = await storage.claim_batch(claim(lease=60))
        assert await storage.rescue_expired() == []
        assert (await storage.get(task.id)) == task

    async def test_a_worker_that_lost_its_lease_cannot_overwrite_the_new_owner(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task()])
        (old,) = await storage.claim_batch(claim(worker="slow", lease=0.05))
        await wait_until(storage.rescue_expired)
        (new,) = await storage.claim_batch(claim(worker="fresh"))
        assert new.attempts == 2
        assert await storage.finish_batch([finish(old, result="stale")]) == [None]
        assert await storage.renew_leases([lease_of(old)], 30) == {}
        assert (
            await storage.save_progress(
                [ProgressUpdate(lease=lease_of(old), progress=Progress(1, 2))]
            )
            == set()
        )
        (done,) = await storage.finish_batch([finish(new, result="fresh")])
        assert done is not None and done.result == "fresh"

    async def test_save_progress_is_fenced_by_the_lease(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task()])
        (task,) = await storage.claim_batch(claim())
        written = await storage.save_progress(
            [ProgressUpdate(lease=lease_of(task), progress=Progress(2, 10, "two"), data={"k": "v"})]
        )
        assert written == {task.id}
        current = await storage.get(task.id)
        assert current is not None
        assert current.progress == Progress(2, 10, "two")
        assert current.progress.pct == 20
        assert current.data == {"k": "v"}

    # -- redrive ------------------------------------------------------------------

    async def test_retry_redrives_a_failed_task_with_a_fresh_budget(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task(max_retries=0)])
        (task,) = await storage.claim_batch(claim())
        await storage.finish_batch([finish(task, FinishKind.FAIL, error="x")])
        redriven = await storage.retry(task.id)
        assert redriven.status is TaskStatus.PENDING
        assert redriven.attempts == 0
        assert redriven.error is None and redriven.finished_at is None
        (again,) = await storage.claim_batch(claim())
        assert again.id == task.id
        assert len(await storage.attempts(task.id)) == 1

    async def test_retry_refuses_active_tasks_and_unknown_ids(self, storage: TaskStorage) -> None:
        (task,) = await storage.enqueue([new_task()])
        with pytest.raises(InvalidTransition):
            await storage.retry(task.id)
        with pytest.raises(TaskNotFound):
            await storage.retry(str(uuid.uuid4()))

    # -- dedupe -----------------------------------------------------------------

    async def test_dedupe_key_with_an_active_leader_makes_an_alias(
        self, storage: TaskStorage
    ) -> None:
        (leader,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        (alias,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        assert leader.alias_of is None
        assert alias.alias_of == leader.id
        assert alias.status is TaskStatus.PENDING
        claimed = await storage.claim_batch(claim("t"))
        assert [t.id for t in claimed] == [leader.id]

    async def test_dedupe_is_scoped_by_app_and_type(self, storage: TaskStorage) -> None:
        tasks = await storage.enqueue(
            [
                new_task("t", dedupe_key="k"),
                new_task("u", dedupe_key="k"),
                new_task("t", dedupe_key="k", app_id="a"),
            ]
        )
        assert all(t.alias_of is None for t in tasks)

    async def test_aliases_take_the_leaders_outcome(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task("t", dedupe_key="k")])
        aliases = await storage.enqueue([new_task("t", dedupe_key="k") for _ in range(3)])
        (running,) = await storage.claim_batch(claim("t"))
        await storage.finish_batch([finish(running, result={"v": 1})])
        for alias in aliases:
            current = await storage.get(alias.id)
            assert current is not None
            assert current.status is TaskStatus.COMPLETED
            assert current.result == {"v": 1}

    async def test_a_terminal_leader_frees_its_dedupe_key(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task("t", dedupe_key="k")])
        (running,) = await storage.claim_batch(claim("t"))
        await storage.finish_batch([finish(running, FinishKind.FAIL, error="x")])
        (second,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        assert second.alias_of is None

    async def test_concurrent_enqueues_with_one_key_yield_one_leader(
        self, storage: TaskStorage
    ) -> None:
        results = await asyncio.gather(
            *(storage.enqueue([new_task("t", dedupe_key="same")]) for _ in range(20))
        )
        tasks = [t for batch in results for t in batch]
        leaders = [t for t in tasks if t.alias_of is None]
        assert len(leaders) == 1
        assert all(t.alias_of == leaders[0].id for t in tasks if t is not leaders[0])

    # -- queries ----------------------------------------------------------------

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
        await asyncio.sleep(0.01)
        middle = utcnow()
        await asyncio.sleep(0.01)
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

    async def test_next_run_at_reports_the_earliest_pending_task(
        self, storage: TaskStorage
    ) -> None:
        assert await storage.next_run_at([(None, "job")]) is None
        soon = utcnow() + timedelta(seconds=30)
        await storage.enqueue(
            [new_task(run_at=soon + timedelta(hours=1)), new_task(run_at=soon), new_task("other")]
        )
        earliest = await storage.next_run_at([(None, "job")])
        assert earliest is not None and abs((earliest - soon).total_seconds()) < 0.001

    # -- retention --------------------------------------------------------------

    async def test_cleanup_deletes_old_terminal_tasks_and_their_log(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task() for _ in range(3)])
        done, failed, _running = await storage.claim_batch(claim(limit=3))
        await storage.finish_batch([finish(done), finish(failed, FinishKind.FAIL, error="x")])
        (pending,) = await storage.enqueue([new_task()])
        assert await storage.cleanup(timedelta(hours=1)) == 0
        await asyncio.sleep(0.02)
        assert await storage.cleanup(timedelta(0)) == 1
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
