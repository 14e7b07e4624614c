"""Contract: delete on finish (docs/retention.md, "Delete on complete").

A finish with :attr:`~taskmill.storage.Finish.delete` that ends its task COMPLETED or
FAILED deletes it in the same transaction, with the aliases it settles and their
execution logs, after settling its dependents. Its events stay readable, carrying the
last snapshot (the tombstone), until pruning; :meth:`~taskmill.TaskStorage.deleted_task`
returns that snapshot meanwhile. Everything else about the finish is as in keep mode.
Store-level scenarios first, then the same through a ``Taskmill`` and its worker (the
``edge_taskmill`` fixture of :class:`~taskmill.testing.edges.EdgeContract`).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import attrs

from taskmill.app import Taskmill
from taskmill.context import Context
from taskmill.errors import Fail
from taskmill.model import CancelReason, EventKind, TaskEvent, TaskFilter, TaskStatus
from taskmill.storage import FinishKind, TaskStorage
from taskmill.testing.capabilities import requires
from taskmill.testing.events import read_all_events
from taskmill.testing.helpers import claim, finish, new_task, wait_until

__all__ = ["RetentionContract"]

_WORKER: dict[str, Any] = {"handle_signals": False, "min_poll_interval": 0.01}


def _of(events: list[TaskEvent], task_id: str) -> list[tuple[EventKind, TaskStatus]]:
    return [(e.kind, e.status) for e in events if e.task.id == task_id]


class RetentionContract:
    """What a deleting finish removes, keeps, settles and still tells."""

    # -- the store ------------------------------------------------------------------

    @requires("delete_on_finish")
    async def test_a_deleting_complete_leaves_no_row_no_log_and_a_tombstone(
        self, storage: TaskStorage
    ) -> None:
        _, start = await storage.read_events(None)
        (task,) = await storage.enqueue([new_task(params={"n": 1})])
        (first,) = await storage.claim_batch(claim())
        await storage.finish_batch([finish(first, FinishKind.RETRY, error="again")])
        (second,) = await storage.claim_batch(claim())
        (done,) = await storage.finish_batch([finish(second, result={"v": [1, "x"]}, delete=True)])
        assert done is not None and done.status is TaskStatus.COMPLETED
        assert done.result == {"v": [1, "x"]}
        assert await storage.get(task.id) is None
        assert await storage.attempts(task.id) == []
        assert await storage.query(TaskFilter(), limit=10) == []
        assert (await storage.summary(TaskFilter())).total == 0
        gone = await storage.deleted_task(task.id)
        assert gone is not None
        assert (gone.id, gone.status, gone.result, gone.attempts, gone.params) == (
            task.id,
            TaskStatus.COMPLETED,
            {"v": [1, "x"]},
            2,
            {"n": 1},
        )
        assert gone.finished_at is not None and gone.worker_id is None
        # Every event of the deleted task is still read, carrying the tombstone.
        events = await read_all_events(storage, start)
        assert _of(events, task.id) == [
            (EventKind.ENQUEUED, TaskStatus.PENDING),
            (EventKind.STARTED, TaskStatus.RUNNING),
            (EventKind.RETRYING, TaskStatus.PENDING),
            (EventKind.STARTED, TaskStatus.RUNNING),
            (EventKind.COMPLETED, TaskStatus.COMPLETED),
        ]
        assert {(e.task.status, repr(e.task.result)) for e in events} == {
            (TaskStatus.COMPLETED, repr({"v": [1, "x"]}))
        }

    @requires("delete_on_finish")
    async def test_a_finish_without_delete_keeps_the_task(self, storage: TaskStorage) -> None:
        (task,) = await storage.enqueue([new_task()])
        (running,) = await storage.claim_batch(claim())
        await storage.finish_batch([finish(running, result=1)])
        kept = await storage.get(task.id)
        assert kept is not None and kept.status is TaskStatus.COMPLETED
        assert len(await storage.attempts(task.id)) == 1
        assert await storage.deleted_task(task.id) is None

    @requires("delete_on_finish")
    async def test_a_deleting_fail_deletes_and_a_retry_or_release_does_not(
        self, storage: TaskStorage
    ) -> None:
        failed, retried, released = await storage.enqueue([new_task() for _ in range(3)])
        running = {t.id: t for t in await storage.claim_batch(claim())}
        await storage.finish_batch(
            [
                finish(running[failed.id], FinishKind.FAIL, error="bad input", delete=True),
                finish(running[retried.id], FinishKind.RETRY, error="later", delete=True),
                finish(running[released.id], FinishKind.RELEASE, delete=True),
            ]
        )
        assert await storage.get(failed.id) is None
        gone = await storage.deleted_task(failed.id)
        assert gone is not None and gone.status is TaskStatus.FAILED
        assert gone.error == "bad input"
        for kept in (retried, released):
            now = await storage.get(kept.id)
            assert now is not None and now.status is TaskStatus.PENDING
            assert await storage.deleted_task(kept.id) is None

    @requires("delete_on_finish")
    async def test_a_stop_request_makes_a_deleting_fail_a_release_that_keeps_the_task(
        self, storage: TaskStorage
    ) -> None:
        (task,) = await storage.enqueue([new_task()])
        (running,) = await storage.claim_batch(claim())
        await storage.cancel(task_ids=[task.id], reason=CancelReason.SUSPENDED)
        await storage.finish_batch([finish(running, FinishKind.FAIL, error="x", delete=True)])
        now = await storage.get(task.id)
        assert now is not None and now.status is TaskStatus.PENDING
        assert await storage.deleted_task(task.id) is None

    @requires("delete_on_finish")
    async def test_a_lost_lease_deletes_nothing(self, storage: TaskStorage) -> None:
        (task,) = await storage.enqueue([new_task()])
        (running,) = await storage.claim_batch(claim(lease=0.05))
        await wait_until(lambda: storage.rescue_expired(), timeout=10)
        (lost,) = await storage.finish_batch([finish(running, result=1, delete=True)])
        assert lost is None
        now = await storage.get(task.id)
        assert now is not None and now.status is TaskStatus.PENDING
        assert await storage.deleted_task(task.id) is None

    @requires("delete_on_finish")
    async def test_a_batch_deletes_only_the_finishes_that_ask(self, storage: TaskStorage) -> None:
        tasks = await storage.enqueue([new_task(params={"i": i}) for i in range(4)])
        running = {t.id: t for t in await storage.claim_batch(claim())}
        await storage.finish_batch(
            [finish(running[t.id], result=i, delete=i % 2 == 0) for i, t in enumerate(tasks)]
        )
        left = await storage.query(TaskFilter(), limit=10)
        assert sorted(t.id for t in left) == sorted([tasks[1].id, tasks[3].id])
        for i in (0, 2):
            gone = await storage.deleted_task(tasks[i].id)
            assert gone is not None and gone.result == i

    @requires("delete_on_finish")
    async def test_aliases_take_the_result_and_go_with_their_leader(
        self, storage: TaskStorage
    ) -> None:
        _, start = await storage.read_events(None)
        (leader,) = await storage.enqueue([new_task(dedupe_key="k")])
        aliases = await storage.enqueue([new_task(dedupe_key="k") for _ in range(2)])
        assert {a.alias_of for a in aliases} == {leader.id}
        (running,) = await storage.claim_batch(claim())
        await storage.finish_batch([finish(running, result={"ok": True}, delete=True)])
        for one in (leader, *aliases):
            assert await storage.get(one.id) is None
            gone = await storage.deleted_task(one.id)
            assert gone is not None and gone.status is TaskStatus.COMPLETED
            assert gone.result == {"ok": True}
        events = await read_all_events(storage, start)
        for alias in aliases:
            assert _of(events, alias.id)[-1] == (EventKind.COMPLETED, TaskStatus.COMPLETED)
        # The key is free: the next enqueue makes a new leader.
        (fresh,) = await storage.enqueue([new_task(dedupe_key="k")])
        assert fresh.alias_of is None

    @requires("dependencies", "delete_on_finish")
    async def test_dependents_are_settled_before_the_delete(self, storage: TaskStorage) -> None:
        first, failing = await storage.enqueue([new_task("a"), new_task("f")])
        after_first, after_failing, always = await storage.enqueue(
            [
                new_task("b", after=(first.id,)),
                new_task("b", after=(failing.id,)),
                new_task("b", after=(failing.id,), after_always=True),
            ]
        )
        running = {t.id: t for t in await storage.claim_batch(claim("a", "f"))}
        await storage.finish_batch(
            [
                finish(running[first.id], result=1, delete=True),
                finish(running[failing.id], FinishKind.FAIL, error="x", delete=True),
            ]
        )
        assert await storage.get(first.id) is None and await storage.get(failing.id) is None
        cancelled = await storage.get(after_failing.id)
        assert cancelled is not None and cancelled.status is TaskStatus.CANCELLED
        claimed = await storage.claim_batch(claim("b"))
        assert sorted(t.id for t in claimed) == sorted([after_first.id, always.id])

    @requires("delete_on_finish")
    async def test_children_keep_a_parent_id_that_no_longer_resolves(
        self, storage: TaskStorage
    ) -> None:
        (parent,) = await storage.enqueue([new_task("p")])
        (running,) = await storage.claim_batch(claim("p"))
        (child,) = await storage.enqueue([new_task("c", parent_id=parent.id)])
        await storage.finish_batch([finish(running, result=1, delete=True)])
        assert await storage.get(parent.id) is None
        kept = await storage.get(child.id)
        assert kept is not None and kept.parent_id == parent.id
        assert kept.status is TaskStatus.PENDING

    @requires("delete_on_finish")
    async def test_an_id_enqueued_again_after_its_delete_is_deleted_again(
        self, storage: TaskStorage
    ) -> None:
        """The duplicate-id rule covers stored tasks, not tombstones: an id may be
        enqueued again once its task is deleted, and deleting it again replaces the
        tombstone."""
        first = new_task(params={"run": 1})
        await storage.enqueue([first])
        (running,) = await storage.claim_batch(claim())
        await storage.finish_batch([finish(running, result=1, delete=True)])
        again = attrs.evolve(new_task(params={"run": 2}), id=first.id)
        (stored,) = await storage.enqueue([again])
        assert stored.id == first.id and stored.params == {"run": 2}
        (running,) = await storage.claim_batch(claim())
        await storage.finish_batch([finish(running, result=2, delete=True)])
        assert await storage.get(first.id) is None
        gone = await storage.deleted_task(first.id)
        assert gone is not None and (gone.params, gone.result) == ({"run": 2}, 2)

    @requires("delete_on_finish")
    async def test_pruning_the_events_removes_the_tombstones(self, storage: TaskStorage) -> None:
        _, start = await storage.read_events(None)
        (task,) = await storage.enqueue([new_task()])
        (running,) = await storage.claim_batch(claim())
        await storage.finish_batch([finish(running, result=1, delete=True)])
        assert await storage.deleted_task(task.id) is not None

        async def pruned() -> bool:
            await storage.prune_events(timedelta(0))
            return await storage.deleted_task(task.id) is None

        await wait_until(pruned, timeout=10)
        assert _of(await read_all_events(storage, start), task.id) == []

    # -- through a Taskmill and its worker ------------------------------------------

    @requires("delete_on_finish")
    async def test_a_worker_deletes_as_each_handler_says_and_waiters_get_the_result(
        self, edge_taskmill: Taskmill
    ) -> None:
        tm = edge_taskmill

        @tm.handler("gone", delete_completed=True)
        async def gone(ctx: Context, params: dict[str, Any]) -> Any:
            return {"echo": params["n"]}

        @tm.handler("kept")
        async def kept(ctx: Context, params: dict[str, Any]) -> Any:
            return params["n"]

        events = await tm.subscribe()
        first = await tm.enqueue("gone", {"n": 1})
        second = await tm.enqueue("kept", {"n": 2})
        waiting = asyncio.ensure_future(tm.wait(first.id, timeout=30))
        await tm.worker(concurrency=2, **_WORKER).run_until_idle()
        done = await waiting
        assert (done.status, done.result) == (TaskStatus.COMPLETED, {"echo": 1})
        assert await tm.get(first.id) is None
        assert await tm.attempts(first.id) == []
        late = await tm.wait(first.id, timeout=5)  # after the delete: the tombstone
        assert late.result == {"echo": 1}
        stored = await tm.get(second.id)
        assert stored is not None and stored.result == 2
        seen: list[TaskEvent] = []
        async for event in events:
            seen.append(event)
            if event.task.id == first.id and event.kind is EventKind.COMPLETED:
                break
        assert seen[-1].task.result == {"echo": 1}

    @requires("delete_on_finish")
    async def test_the_workers_default_and_a_handlers_override(
        self, edge_taskmill: Taskmill
    ) -> None:
        tm = edge_taskmill

        @tm.handler("default")
        async def default(ctx: Context, params: dict[str, Any]) -> None:
            return None

        @tm.handler("keeps", delete_completed=False)
        async def keeps(ctx: Context, params: dict[str, Any]) -> None:
            return None

        @tm.handler("fails")
        async def fails(ctx: Context, params: dict[str, Any]) -> None:
            raise Fail("no")

        @tm.handler("fails_gone", delete_failed=True)
        async def fails_gone(ctx: Context, params: dict[str, Any]) -> None:
            raise Fail("no")

        tasks = {t: await tm.enqueue(t) for t in ("default", "keeps", "fails", "fails_gone")}
        await tm.worker(delete_completed=True, **_WORKER).run_until_idle()
        status = {t: (await tm.get(task.id)) for t, task in tasks.items()}
        assert status["default"] is None
        assert status["keeps"] is not None and status["keeps"].status is TaskStatus.COMPLETED
        assert status["fails"] is not None and status["fails"].status is TaskStatus.FAILED
        assert status["fails_gone"] is None
        gone = await tm.wait(tasks["fails_gone"].id, timeout=5)
        assert gone.status is TaskStatus.FAILED and gone.error is not None
        assert "no" in gone.error
