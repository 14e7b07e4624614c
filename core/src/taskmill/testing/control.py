"""Contract: control operations (SPEC 5.6, 5.11, 5.12): cancellation, cascades, stop
requests and suspensions, within one store (across two: :mod:`.concurrency`)."""

from __future__ import annotations

import pytest

from taskmill.model import (
    AttemptOutcome,
    CancelReason,
    SuspensionScope,
    TaskFilter,
    TaskStatus,
)
from taskmill.storage import FinishKind, TaskStorage
from taskmill.testing.helpers import claim, finish, lease_of, new_task

__all__ = ["ControlContract"]


async def _status(storage: TaskStorage, task_id: str) -> TaskStatus:
    task = await storage.get(task_id)
    assert task is not None
    return task.status


class ControlContract:
    """Cancellation and suspension."""

    # -- cancellation ---------------------------------------------------------------

    async def test_cancelling_a_pending_task_takes_effect_at_once(
        self, storage: TaskStorage
    ) -> None:
        (task,) = await storage.enqueue([new_task()])
        (cancelled,) = await storage.cancel(task_ids=[task.id], reason=CancelReason.USER)
        assert cancelled.id == task.id
        assert cancelled.status is TaskStatus.CANCELLED
        assert cancelled.cancel_reason is CancelReason.USER
        assert cancelled.finished_at is not None
        assert await storage.claim_batch(claim()) == []

    async def test_a_terminal_cancel_of_a_running_task_wins_over_its_worker(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task()])
        (running,) = await storage.claim_batch(claim(worker="w"))
        (cancelled,) = await storage.cancel(task_ids=[running.id], reason=CancelReason.USER)
        assert cancelled.status is TaskStatus.CANCELLED
        assert cancelled.worker_id is None
        # The worker learns it lost the task and cannot overwrite the cancel.
        assert await storage.watch_leases([lease_of(running)]) == {}
        assert await storage.renew_leases([lease_of(running)], 30) == {}
        assert await storage.finish_batch([finish(running, result="late")]) == [None]
        assert await _status(storage, running.id) is TaskStatus.CANCELLED
        (attempt,) = await storage.attempts(running.id)
        assert attempt.outcome is AttemptOutcome.CANCELLED

    async def test_a_non_terminal_interrupt_asks_the_worker_to_requeue(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task()])
        (running,) = await storage.claim_batch(claim())
        (asked,) = await storage.cancel(task_ids=[running.id], reason=CancelReason.SUSPENDED)
        assert asked.status is TaskStatus.RUNNING
        assert asked.cancel_reason is CancelReason.SUSPENDED
        assert await storage.watch_leases([lease_of(running)]) == {
            running.id: CancelReason.SUSPENDED
        }
        # The handler failing on its way out does not spend the attempt.
        (back,) = await storage.finish_batch([finish(running, FinishKind.RETRY, error="x")])
        assert back is not None
        assert back.status is TaskStatus.PENDING
        assert back.attempts == 0
        assert back.cancel_reason is None

    async def test_a_non_terminal_interrupt_leaves_pending_tasks_alone(
        self, storage: TaskStorage
    ) -> None:
        (task,) = await storage.enqueue([new_task()])
        assert await storage.cancel(task_ids=[task.id], reason=CancelReason.SHUTDOWN) == []
        assert await _status(storage, task.id) is TaskStatus.PENDING

    async def test_cancel_cascades_to_children_and_their_children(
        self, storage: TaskStorage
    ) -> None:
        (parent,) = await storage.enqueue([new_task("p")])
        (child,) = await storage.enqueue([new_task("c", parent_id=parent.id)])
        (grandchild,) = await storage.enqueue([new_task("g", parent_id=child.id)])
        (done_child,) = await storage.enqueue([new_task("d", parent_id=parent.id)])
        (running_done,) = await storage.claim_batch(claim("d"))
        await storage.finish_batch([finish(running_done)])
        changed = await storage.cancel(task_ids=[parent.id], reason=CancelReason.USER)
        assert {t.id for t in changed} == {parent.id, child.id, grandchild.id}
        assert await _status(storage, grandchild.id) is TaskStatus.CANCELLED
        assert await _status(storage, done_child.id) is TaskStatus.COMPLETED

    async def test_cancel_without_cascade_leaves_children_running(
        self, storage: TaskStorage
    ) -> None:
        (parent,) = await storage.enqueue([new_task("p")])
        (child,) = await storage.enqueue([new_task("c", parent_id=parent.id)])
        await storage.cancel(task_ids=[parent.id], reason=CancelReason.USER, cascade=False)
        assert await _status(storage, child.id) is TaskStatus.PENDING

    async def test_aliases_follow_a_cancelled_leader_and_can_be_cancelled_alone(
        self, storage: TaskStorage
    ) -> None:
        (leader,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        first, second = await storage.enqueue(
            [new_task("t", dedupe_key="k"), new_task("t", dedupe_key="k")]
        )
        await storage.cancel(task_ids=[first.id], reason=CancelReason.USER)
        assert await _status(storage, first.id) is TaskStatus.CANCELLED
        assert await _status(storage, leader.id) is TaskStatus.PENDING
        await storage.cancel(task_ids=[leader.id], reason=CancelReason.PREEMPTED)
        alias = await storage.get(second.id)
        assert alias is not None
        assert alias.status is TaskStatus.CANCELLED
        assert alias.cancel_reason is CancelReason.PREEMPTED
        (fresh,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        assert fresh.alias_of is None

    async def test_cancelling_a_finished_task_changes_nothing(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task()])
        (running,) = await storage.claim_batch(claim())
        (done,) = await storage.finish_batch([finish(running, result=1)])
        assert await storage.cancel(task_ids=[running.id], reason=CancelReason.USER) == []
        assert await storage.get(running.id) == done

    async def test_cancel_by_filter_selects_active_tasks(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task("a"), new_task("a"), new_task("b")])
        await storage.enqueue([new_task("a", app_id="other")])
        changed = await storage.cancel(
            filter=TaskFilter(task_types=("a",), app_id=None), reason=CancelReason.USER
        )
        assert len(changed) == 3
        summary = await storage.summary(TaskFilter())
        assert (summary.cancelled, summary.pending) == (3, 1)

    async def test_cancel_by_filter_with_a_dedupe_key(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task("a", dedupe_key="x"), new_task("a", dedupe_key="y")])
        changed = await storage.cancel(
            filter=TaskFilter(task_types=("a",), dedupe_key="x"), reason=CancelReason.PREEMPTED
        )
        assert [t.dedupe_key for t in changed] == ["x"]
        assert changed[0].cancel_reason is CancelReason.PREEMPTED

    async def test_cancel_needs_ids_or_a_filter(self, storage: TaskStorage) -> None:
        with pytest.raises(ValueError, match="task_ids or a filter"):
            await storage.cancel(reason=CancelReason.USER)

    # -- suspension -------------------------------------------------------------------

    async def test_a_global_suspension_stops_claims_until_resumed(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task("a"), new_task("b")])
        await storage.suspend(SuspensionScope())
        assert await storage.claim_batch(claim("a", "b")) == []
        assert await storage.suspensions() == [SuspensionScope()]
        assert await storage.resume(SuspensionScope()) is True
        assert len(await storage.claim_batch(claim("a", "b"))) == 2
        assert await storage.resume(SuspensionScope()) is False

    async def test_a_suspension_covers_only_its_type_and_app(self, storage: TaskStorage) -> None:
        await storage.enqueue(
            [new_task("a"), new_task("b"), new_task("a", app_id="x"), new_task("b", app_id="x")]
        )
        await storage.suspend(SuspensionScope(task_type="a", app_id="x"))
        await storage.suspend(SuspensionScope(task_type="b", app_id="x"))
        await storage.suspend(SuspensionScope(task_type="b", app_id="x"))  # idempotent
        claimed = await storage.claim_batch(claim("a", "b"))
        assert sorted((t.task_type, t.app_id or "") for t in claimed) == [("a", ""), ("b", "")]
        assert len(await storage.suspensions()) == 2
        await storage.suspend(SuspensionScope(app_id="x"))
        await storage.resume(SuspensionScope(task_type="a", app_id="x"))
        assert await storage.claim_batch(claim("a", "b")) == []  # app x is still suspended

    async def test_suspending_asks_running_tasks_in_scope_to_requeue(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task("a"), new_task("b")])
        a, b = await storage.claim_batch(claim("a", "b"))
        assert await storage.suspend(SuspensionScope(task_type="a")) == 1
        watched = await storage.watch_leases([lease_of(a), lease_of(b)])
        assert watched == {a.id: CancelReason.SUSPENDED, b.id: None}

    async def test_next_run_at_ignores_suspended_tasks(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task("a"), new_task("b", app_id="x")])
        await storage.suspend(SuspensionScope(task_type="a"))
        assert await storage.next_run_at([(None, "a")]) is None
        assert await storage.next_run_at([(None, "b")]) is not None
        await storage.suspend(SuspensionScope(app_id="x"))
        assert await storage.next_run_at([(None, "b"), ("x", "b")]) is None
        await storage.resume(SuspensionScope(task_type="a"))
        assert await storage.next_run_at([(None, "a")]) is not None

    async def test_cancelling_a_leader_returns_only_the_aliases_it_changed(
        self, storage: TaskStorage
    ) -> None:
        (leader,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        early, late = await storage.enqueue(
            [new_task("t", dedupe_key="k"), new_task("t", dedupe_key="k")]
        )
        await storage.cancel(task_ids=[early.id], reason=CancelReason.USER)
        changed = await storage.cancel(task_ids=[leader.id], reason=CancelReason.USER)
        assert sorted(t.id for t in changed) == sorted([leader.id, late.id])

    async def test_cascade_reaches_the_children_of_a_selected_alias(
        self, storage: TaskStorage
    ) -> None:
        (leader,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        (alias,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        (child,) = await storage.enqueue([new_task("c", parent_id=alias.id)])
        await storage.cancel(task_ids=[leader.id, alias.id], reason=CancelReason.USER)
        assert await _status(storage, child.id) is TaskStatus.CANCELLED
