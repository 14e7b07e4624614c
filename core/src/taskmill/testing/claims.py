"""Contract: claiming (SPEC 5.2, 5.3): which tasks a claim takes, in which order, for
which handlers; and when the next task is due."""

from __future__ import annotations

from datetime import timedelta

from taskmill.model import Priority, TaskFilter, TaskStatus
from taskmill.storage import TaskStorage, utcnow
from taskmill.testing.helpers import claim, new_task

__all__ = ["ClaimContract"]


class ClaimContract:
    """A claim takes due leaders of the worker's handlers, highest priority first."""

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

    async def test_next_run_at_sees_app_keys_and_ignores_aliases(
        self, storage: TaskStorage
    ) -> None:
        soon = utcnow() + timedelta(minutes=5)
        later = soon + timedelta(minutes=5)
        await storage.enqueue([new_task("t", app_id="a", run_at=later)])
        await storage.enqueue([new_task("t", app_id="b", run_at=soon, dedupe_key="k")])
        await storage.enqueue(
            [new_task("t", app_id="b", run_at=soon - timedelta(minutes=1), dedupe_key="k")]
        )  # an alias: never claimed
        found = await storage.next_run_at([("a", "t")])
        assert found is not None and abs((found - later).total_seconds()) < 0.001
        found = await storage.next_run_at([(None, "t")])
        assert found is not None and abs((found - soon).total_seconds()) < 0.001
        assert await storage.next_run_at([("c", "t"), (None, "u")]) is None

    async def test_next_run_at_ignores_running_tasks(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task()])
        await storage.claim_batch(claim())
        assert await storage.next_run_at([(None, "job")]) is None
