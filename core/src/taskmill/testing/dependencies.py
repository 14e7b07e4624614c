"""Contract: task dependencies (``after=``, docs/dependencies.md): a dependent is claimed
only once its dependencies have ended as its policy asks, and is settled in the same
transaction as each dependency's end."""

from __future__ import annotations

import asyncio

import pytest

from taskmill.errors import InvalidTaskSpec
from taskmill.model import CancelReason, EventKind, Task, TaskFilter, TaskStatus
from taskmill.storage import FinishKind, TaskStorage
from taskmill.testing.capabilities import requires
from taskmill.testing.fixtures import StorageFactory
from taskmill.testing.helpers import claim, finish, new_task, wait_until

__all__ = ["DependencyContract"]


async def _run(storage: TaskStorage, task_type: str = "job") -> Task:
    """Claim exactly one task of ``task_type``."""
    (task,) = await storage.claim_batch(claim(task_type, limit=1))
    return task


async def _status(storage: TaskStorage, task_id: str) -> Task:
    current = await storage.get(task_id)
    assert current is not None, f"task {task_id} is gone"
    return current


class DependencyContract:
    """Dependencies hold on every backend: waiting, release, cancellation, policies."""

    @requires("dependencies")
    async def test_a_dependent_waits_until_its_dependency_completes(
        self, storage: TaskStorage
    ) -> None:
        (first,) = await storage.enqueue([new_task("a")])
        (second,) = await storage.enqueue([new_task("b", after=(first.id,))])
        assert second.status is TaskStatus.PENDING
        assert await storage.claim_batch(claim("b")) == []
        assert await storage.next_run_at([(None, "b")]) is None
        summary = await storage.summary(TaskFilter())
        assert (summary.pending, summary.waiting) == (2, 1)
        running = await _run(storage, "a")
        assert await storage.claim_batch(claim("b")) == []
        await storage.finish_batch([finish(running)])
        assert (await storage.summary(TaskFilter())).waiting == 0
        assert await storage.next_run_at([(None, "b")]) is not None
        claimed = await storage.claim_batch(claim("b"))
        assert [t.id for t in claimed] == [second.id]

    @requires("dependencies")
    async def test_every_dependency_must_complete(self, storage: TaskStorage) -> None:
        one, two = await storage.enqueue([new_task("a"), new_task("a")])
        (last,) = await storage.enqueue([new_task("b", after=(one.id, two.id))])
        first = await _run(storage, "a")
        await storage.finish_batch([finish(first)])
        assert await storage.claim_batch(claim("b")) == []
        assert (await storage.summary(TaskFilter(task_types=("b",)))).waiting == 1
        second = await _run(storage, "a")
        await storage.finish_batch([finish(second)])
        assert [t.id for t in await storage.claim_batch(claim("b"))] == [last.id]

    @requires("dependencies")
    async def test_a_failed_dependency_cancels_its_dependents_naming_it(
        self, storage: TaskStorage
    ) -> None:
        (first,) = await storage.enqueue([new_task("a", max_retries=0)])
        (second,) = await storage.enqueue([new_task("b", after=(first.id,))])
        (third,) = await storage.enqueue([new_task("c", after=(second.id,))])
        running = await _run(storage, "a")
        await storage.finish_batch([finish(running, FinishKind.FAIL, error="boom")])
        for dependent in (second, third):
            current = await _status(storage, dependent.id)
            assert current.status is TaskStatus.CANCELLED
            assert current.cancel_reason is CancelReason.PREEMPTED
            assert current.finished_at is not None
            assert current.error is not None
        assert first.id in (await _status(storage, second.id)).error  # type: ignore[operator]
        assert second.id in (await _status(storage, third.id)).error  # type: ignore[operator]
        assert await storage.claim_batch(claim("b", "c")) == []
        assert await storage.attempts(second.id) == []

    @requires("dependencies")
    async def test_after_policy_always_runs_after_a_failure(self, storage: TaskStorage) -> None:
        (first,) = await storage.enqueue([new_task("a", max_retries=0)])
        (second,) = await storage.enqueue([new_task("b", after=(first.id,), after_always=True)])
        running = await _run(storage, "a")
        assert await storage.claim_batch(claim("b")) == []
        await storage.finish_batch([finish(running, FinishKind.FAIL, error="boom")])
        assert [t.id for t in await storage.claim_batch(claim("b"))] == [second.id]

    @requires("dependencies")
    async def test_cancelling_a_dependency_cancels_its_dependents(
        self, storage: TaskStorage
    ) -> None:
        (first,) = await storage.enqueue([new_task("a")])
        kept, always = await storage.enqueue(
            [new_task("b", after=(first.id,)), new_task("c", after=(first.id,), after_always=True)]
        )
        changed = await storage.cancel(task_ids=[first.id])
        assert {t.id for t in changed} >= {first.id, kept.id}
        assert (await _status(storage, kept.id)).status is TaskStatus.CANCELLED
        assert [t.id for t in await storage.claim_batch(claim("b", "c"))] == [always.id]

    @requires("dependencies")
    async def test_a_rescue_that_gives_up_cancels_dependents(self, storage: TaskStorage) -> None:
        (first,) = await storage.enqueue([new_task("a", max_retries=0)])
        (second,) = await storage.enqueue([new_task("b", after=(first.id,))])
        await storage.claim_batch(claim("a", lease=0.05))
        await wait_until(storage.rescue_expired)
        assert (await _status(storage, first.id)).status is TaskStatus.FAILED
        assert (await _status(storage, second.id)).status is TaskStatus.CANCELLED

    @requires("dependencies")
    async def test_unknown_or_foreign_dependencies_are_refused_storing_nothing(
        self, storage: TaskStorage
    ) -> None:
        (other_app,) = await storage.enqueue([new_task("a", app_id="other")])
        before = await storage.summary(TaskFilter())
        with pytest.raises(InvalidTaskSpec, match="no-such-task"):
            await storage.enqueue([new_task("b"), new_task("b", after=("no-such-task",))])
        with pytest.raises(InvalidTaskSpec, match=other_app.id):
            await storage.enqueue([new_task("b", after=(other_app.id,))])
        assert await storage.summary(TaskFilter()) == before

    @requires("dependencies")
    async def test_dependencies_already_ended_are_resolved_at_once(
        self, storage: TaskStorage
    ) -> None:
        done, failed = await storage.enqueue([new_task("a"), new_task("a", max_retries=0)])
        await storage.finish_batch([finish(await _run(storage, "a"))])
        running = await _run(storage, "a")
        await storage.finish_batch([finish(running, FinishKind.FAIL, error="x")])
        ready, doomed, anyway = await storage.enqueue(
            [
                new_task("b", after=(done.id,)),
                new_task("c", after=(done.id, failed.id)),
                new_task("b", after=(failed.id,), after_always=True),
            ]
        )
        assert doomed.status is TaskStatus.CANCELLED
        assert failed.id in (doomed.error or "")
        stored = await _status(storage, doomed.id)
        assert stored.status is TaskStatus.CANCELLED and stored.cancel_reason is not None
        claimed = await storage.claim_batch(claim("b", "c"))
        assert {t.id for t in claimed} == {ready.id, anyway.id}

    @requires("dependencies")
    async def test_an_alias_dependency_follows_its_leader(self, storage: TaskStorage) -> None:
        (leader,) = await storage.enqueue([new_task("a", dedupe_key="k")])
        (alias,) = await storage.enqueue([new_task("a", dedupe_key="k")])
        assert alias.alias_of == leader.id
        (dependent,) = await storage.enqueue([new_task("b", after=(alias.id,))])
        assert await storage.claim_batch(claim("b")) == []
        await storage.finish_batch([finish(await _run(storage, "a"))])
        assert (await _status(storage, alias.id)).status is TaskStatus.COMPLETED
        assert [t.id for t in await storage.claim_batch(claim("b"))] == [dependent.id]

    @requires("dependencies")
    async def test_redriving_a_failed_dependency_leaves_cancelled_dependents(
        self, storage: TaskStorage
    ) -> None:
        (first,) = await storage.enqueue([new_task("a", max_retries=0)])
        (second,) = await storage.enqueue([new_task("b", after=(first.id,))])
        running = await _run(storage, "a")
        await storage.finish_batch([finish(running, FinishKind.FAIL, error="x")])
        await storage.retry(first.id)
        await storage.finish_batch([finish(await _run(storage, "a"))])
        assert (await _status(storage, second.id)).status is TaskStatus.CANCELLED
        # Redriving the dependent itself runs it: the edge it was cancelled by is resolved.
        await storage.retry(second.id)
        assert [t.id for t in await storage.claim_batch(claim("b"))] == [second.id]

    @requires("dependencies")
    async def test_a_redriven_dependent_waits_for_dependencies_still_unfinished(
        self, storage: TaskStorage
    ) -> None:
        fails, slow = await storage.enqueue([new_task("a", max_retries=0), new_task("s")])
        (dependent,) = await storage.enqueue([new_task("b", after=(fails.id, slow.id))])
        running = await _run(storage, "a")
        await storage.finish_batch([finish(running, FinishKind.FAIL, error="x")])
        assert (await _status(storage, dependent.id)).status is TaskStatus.CANCELLED
        await storage.retry(dependent.id)
        assert await storage.claim_batch(claim("b")) == []
        await storage.finish_batch([finish(await _run(storage, "s"))])
        assert [t.id for t in await storage.claim_batch(claim("b"))] == [dependent.id]

    @requires("dependencies")
    async def test_release_and_cancellation_are_events(self, storage: TaskStorage) -> None:
        _, cursor = await storage.read_events(None)
        first, bad = await storage.enqueue([new_task("a"), new_task("f", max_retries=0)])
        released, cancelled = await storage.enqueue(
            [new_task("b", after=(first.id,)), new_task("b", after=(bad.id,))]
        )
        await storage.finish_batch([finish(await _run(storage, "a"))])
        running = await _run(storage, "f")
        await storage.finish_batch([finish(running, FinishKind.FAIL, error="x")])
        events, _ = await storage.read_events(cursor)
        seen = [(e.kind, e.task.id, e.status) for e in events]
        assert (EventKind.RELEASED, released.id, TaskStatus.PENDING) in seen
        assert (EventKind.CANCELLED, cancelled.id, TaskStatus.CANCELLED) in seen
        assert (EventKind.RELEASED, cancelled.id, TaskStatus.PENDING) not in seen

    @requires("dependencies")
    async def test_a_chain_runs_in_order(self, storage: TaskStorage) -> None:
        ids: list[str] = []
        for _ in range(40):
            (task,) = await storage.enqueue([new_task(after=tuple(ids[-1:]))])
            ids.append(task.id)
        ran: list[str] = []
        while len(ran) < len(ids):
            claimed = await storage.claim_batch(claim(limit=10))
            assert len(claimed) == 1, f"{len(claimed)} claimable after {len(ran)}"
            ran.append(claimed[0].id)
            await storage.finish_batch([finish(claimed[0])])
        assert ran == ids

    @requires("dependencies")
    @requires("shared_between_processes")
    async def test_a_dependency_ending_during_the_enqueue_loses_no_release(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        other = await storage_factory()
        for _ in range(15):
            (first,) = await storage.enqueue([new_task("a")])
            running = await _run(storage, "a")
            dependent_batch, finished = await asyncio.gather(
                other.enqueue([new_task("b", after=(first.id,))]),
                storage.finish_batch([finish(running)]),
            )
            assert finished[0] is not None
            (dependent,) = dependent_batch
            claimed = await storage.claim_batch(claim("b"))
            assert [t.id for t in claimed] == [dependent.id]
            await storage.finish_batch([finish(claimed[0])])
