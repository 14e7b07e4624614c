"""Contract: the end of an attempt (SPEC 5.1, 5.4, 5.6): each finish kind, stop requests,
batches, and redriving a dead letter."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from attrs import evolve

from taskmill.errors import InvalidTransition, TaskNotFound
from taskmill.model import AttemptOutcome, CancelReason, Progress, TaskFilter, TaskStatus
from taskmill.storage import Finish, FinishKind, Lease, ProgressUpdate, TaskStorage, utcnow
from taskmill.testing.helpers import claim, finish, lease_of, new_task, wait_until

__all__ = ["FinishContract"]


class FinishContract:
    """A finish fenced by a live lease moves the task as its kind says, once."""

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

    async def test_finish_batch_applied_makes_the_same_changes_without_snapshots(
        self, storage: TaskStorage
    ) -> None:
        leader, alias = new_task(dedupe_key="k"), new_task(dedupe_key="k")
        await storage.enqueue([leader, alias, new_task(), new_task(), new_task()])
        done, retried, failed, lost = await storage.claim_batch(claim(limit=10))
        stale = Lease(task_id=lost.id, worker_id="other", attempt=lost.attempts)
        now = utcnow()
        applied = await storage.finish_batch_applied(
            [
                finish(done, result={"v": 1}),
                finish(retried, FinishKind.RETRY, error="again"),
                finish(failed, FinishKind.FAIL, error="bad"),
                Finish(stale, FinishKind.COMPLETE, AttemptOutcome.COMPLETED, now, now, "1"),
                finish(done, result={"v": 2}),  # its lease is gone by then
            ]
        )
        assert applied == [True, True, True, False, False]
        by_id = {t.id: t for t in await storage.query(TaskFilter())}
        assert by_id[done.id].status is TaskStatus.COMPLETED
        assert by_id[done.id].result == {"v": 1}
        assert by_id[retried.id].status is TaskStatus.PENDING
        assert by_id[retried.id].error == "again"
        assert by_id[failed.id].status is TaskStatus.FAILED
        assert by_id[lost.id].status is TaskStatus.RUNNING
        for task in (done, retried, failed):
            assert len(await storage.attempts(task.id)) == 1
        # the alias settles with its leader, whichever of the claimed was the leader
        settled = by_id[alias.id]
        assert settled.status is by_id[leader.id].status
        assert await storage.finish_batch_applied([]) == []

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

    async def test_one_batch_mixes_every_kind_in_order(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task() for _ in range(5)])
        c, r, f, rel, can = await storage.claim_batch(claim(limit=5))
        results = await storage.finish_batch(
            [
                finish(c, result=[1], data={"d": 1}),
                finish(r, FinishKind.RETRY, error="r", retry_in=60, progress=Progress(1, None)),
                finish(f, FinishKind.FAIL, error="f"),
                finish(rel, FinishKind.RELEASE),
                finish(can, FinishKind.CANCEL, cancel_reason=CancelReason.PREEMPTED, error="p"),
            ]
        )
        assert [t.id if t else None for t in results] == [c.id, r.id, f.id, rel.id, can.id]
        assert [t.status if t else None for t in results] == [
            TaskStatus.COMPLETED,
            TaskStatus.PENDING,
            TaskStatus.FAILED,
            TaskStatus.PENDING,
            TaskStatus.CANCELLED,
        ]
        done, retried, failed, released, cancelled = results
        assert done is not None and done.result == [1] and done.data == {"d": 1}
        assert retried is not None and retried.progress == Progress()  # a requeue resets it
        assert retried.attempts == 1 and retried.error == "r"
        assert retried.run_at > utcnow() + timedelta(seconds=50)
        assert failed is not None and failed.error == "f" and failed.finished_at is not None
        assert released is not None and released.attempts == 0
        assert cancelled is not None and cancelled.cancel_reason is CancelReason.PREEMPTED
        assert cancelled.error == "p"
        for task in results:
            assert task is not None and await storage.get(task.id) == task
        outcomes = [(await storage.attempts(t.id))[0].outcome for t in (c, r, f, rel, can)]
        assert outcomes == [
            AttemptOutcome.COMPLETED,
            AttemptOutcome.FAILED,
            AttemptOutcome.FAILED,
            AttemptOutcome.INTERRUPTED,
            AttemptOutcome.CANCELLED,
        ]

    @pytest.mark.parametrize("reason", [CancelReason.SUSPENDED, CancelReason.SHUTDOWN])
    async def test_a_stop_request_turns_retry_and_fail_into_release(
        self, storage: TaskStorage, reason: CancelReason
    ) -> None:
        await storage.enqueue([new_task(), new_task(), new_task()])
        retrying, failing, completing = await storage.claim_batch(claim(limit=3))
        running = (retrying, failing, completing)
        asked = await storage.cancel(task_ids=[t.id for t in running], reason=reason)
        assert sorted(t.id for t in asked) == sorted(t.id for t in running)
        held = await storage.renew_leases([lease_of(t) for t in running], 30)
        assert held == dict.fromkeys((t.id for t in running), reason)
        r, f, c = await storage.finish_batch(
            [
                finish(retrying, FinishKind.RETRY, error="x", retry_in=3600),
                finish(failing, FinishKind.FAIL, error="y"),
                finish(completing, result=1),
            ]
        )
        for task, error in ((r, "x"), (f, "y")):
            assert task is not None and task.status is TaskStatus.PENDING
            assert task.attempts == 0 and task.cancel_reason is None
            assert task.run_at < utcnow() + timedelta(minutes=1)  # not the retry's delay
            (logged,) = await storage.attempts(task.id)
            assert logged.outcome is AttemptOutcome.INTERRUPTED and logged.error == error
        assert c is not None and c.status is TaskStatus.COMPLETED and c.cancel_reason is None

    async def test_a_task_named_twice_in_one_finish_batch_is_finished_once(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task(), new_task()])
        a, b = await storage.claim_batch(claim(limit=2))
        imposter = evolve(
            finish(b, result="imposter"),
            lease=Lease(task_id=b.id, worker_id="someone-else", attempt=b.attempts),
        )
        results = await storage.finish_batch(
            [
                finish(a, result="first"),
                finish(a, result="second"),
                imposter,
                finish(b, result="real"),
            ]
        )
        assert results[1] is None and results[2] is None
        assert results[0] is not None and results[0].result == "first"
        assert results[3] is not None and results[3].result == "real"
        current = await storage.get(a.id)
        assert current is not None and current.result == "first"
        assert len(await storage.attempts(a.id)) == 1
        assert len(await storage.attempts(b.id)) == 1

    async def test_a_large_finish_batch_applies_every_finish_in_order(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task(params={"i": i}) for i in range(500)])
        claimed = await storage.claim_batch(claim(limit=500))
        assert len(claimed) == 500
        results = await storage.finish_batch([finish(t, result=i) for i, t in enumerate(claimed)])
        assert [t.result if t else None for t in results] == list(range(500))
        assert (await storage.summary(TaskFilter())).completed == 500
