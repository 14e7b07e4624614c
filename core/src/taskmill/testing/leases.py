"""Contract: leases (SPEC 5.5): renewing and watching them, fencing writes with them, and
rescuing the tasks of workers that died."""

from __future__ import annotations

from datetime import timedelta

import attrs
import pytest

from taskmill.model import AttemptOutcome, CancelReason, Progress, Task, TaskStatus
from taskmill.storage import LEASE_FENCE, ProgressUpdate, TaskStorage, utcnow
from taskmill.testing.helpers import claim, finish, lease_of, new_task, wait_until

__all__ = ["LeaseContract"]


class LeaseContract:
    """A lease is the fencing token of a running task; an expired one is rescued once."""

    async def test_renew_extends_held_leases_only(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task(), new_task()])
        a, b = await storage.claim_batch(claim(lease=5))
        await storage.finish_batch([finish(b)])
        held = await storage.renew_leases([lease_of(a), lease_of(b)], 120)
        assert held == {a.id: None}
        renewed = await storage.get(a.id)
        assert renewed is not None and renewed.lease_expires_at is not None
        assert renewed.lease_expires_at > utcnow() + timedelta(seconds=100)

    async def test_watch_leases_reads_without_extending(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task()])
        (task,) = await storage.claim_batch(claim(lease=30))
        assert await storage.watch_leases([lease_of(task)]) == {task.id: None}
        current = await storage.get(task.id)
        assert current is not None
        assert current.lease_expires_at == task.lease_expires_at

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

    @pytest.mark.parametrize("field", [name for name, _ in LEASE_FENCE])
    async def test_each_field_of_the_lease_fence_fences_every_lease_write(
        self, storage: TaskStorage, field: str
    ) -> None:
        """A lease that differs from the task in one :data:`~taskmill.storage.LEASE_FENCE`
        field alone (or a task no longer RUNNING, for the status) renews, watches,
        saves progress for and finishes nothing; the task is left as it was."""
        await storage.enqueue([new_task(), new_task()])
        task, other = await storage.claim_batch(claim(limit=2))  # one worker holds both
        lease = lease_of(task)
        if field == "status":
            await storage.finish_batch([finish(task)])  # COMPLETED: no longer leased
        elif field == "id":
            lease = attrs.evolve(lease, task_id=f"{task.id[:8]}-not-stored")
        elif field == "worker_id":
            lease = attrs.evolve(lease, worker_id="intruder")
        else:
            assert field == "attempts", f"a fence field this test does not know: {field}"
            lease = attrs.evolve(lease, attempt=task.attempts + 1)
        before = {t.id: await storage.get(t.id) for t in (task, other)}
        assert await storage.renew_leases([lease], 300) == {}
        assert await storage.watch_leases([lease]) == {}
        update = ProgressUpdate(lease=lease, progress=Progress(1, 2))
        assert await storage.save_progress([update]) == set()
        ended = attrs.evolve(finish(task, result="intruder"), lease=lease)
        assert await storage.finish_batch([ended]) == [None]
        after = {t.id: await storage.get(t.id) for t in (task, other)}
        assert after == before

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

    @pytest.mark.parametrize("reason", [CancelReason.SUSPENDED, CancelReason.SHUTDOWN])
    async def test_rescue_honours_a_pending_stop_request(
        self, storage: TaskStorage, reason: CancelReason
    ) -> None:
        await storage.enqueue([new_task(max_retries=0), new_task(max_retries=0)])
        stopped, plain = await storage.claim_batch(claim(lease=0.05, limit=2))
        await storage.cancel(task_ids=[stopped.id], reason=reason)
        rescued: dict[str, Task] = {}

        async def both_rescued() -> bool:
            rescued.update({t.id: t for t in await storage.rescue_expired()})
            return len(rescued) == 2

        await wait_until(both_rescued)
        # The stop request wins over the spent budget: back to PENDING, attempt unspent.
        assert rescued[stopped.id].status is TaskStatus.PENDING
        assert rescued[stopped.id].attempts == 0
        assert rescued[stopped.id].cancel_reason is None
        assert rescued[plain.id].status is TaskStatus.FAILED
        assert rescued[plain.id].error == "lease expired"
        for task in (stopped, plain):
            assert await storage.get(task.id) == rescued[task.id]
            (lost,) = await storage.attempts(task.id)
            assert lost.outcome is AttemptOutcome.LOST

    async def test_rescue_respects_its_limit(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task() for _ in range(5)])
        await storage.claim_batch(claim(lease=0.05, limit=5))
        rescued: list[Task] = []

        async def rescue_two() -> bool:
            batch = await storage.rescue_expired(limit=2)
            assert len(batch) <= 2
            rescued.extend(batch)
            return len(rescued) >= 4

        await wait_until(rescue_two)
        rescued.extend(await wait_until(lambda: storage.rescue_expired(limit=10)))
        assert len(rescued) == len({t.id for t in rescued}) == 5
        assert await storage.rescue_expired() == []
