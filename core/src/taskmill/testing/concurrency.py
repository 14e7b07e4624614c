"""Contract: two store objects on one database, racing for real.

Each test opens a second store through ``storage_factory`` (its own connection or pool,
as another process has) and needs ``shared_between_processes``; a store that is not
shared (``memory://``) skips them, saying so. One store object awaited concurrently
would prove nothing about separate connections.
"""

from __future__ import annotations

import asyncio

from taskmill.model import (
    AttemptOutcome,
    CancelReason,
    EventKind,
    Progress,
    SuspensionScope,
    TaskFilter,
    TaskStatus,
)
from taskmill.storage import (
    FinishKind,
    HandlerRegistration,
    ProgressUpdate,
    StoreChange,
    TaskStorage,
)
from taskmill.testing.capabilities import requires
from taskmill.testing.events import read_all_events
from taskmill.testing.fixtures import StorageFactory
from taskmill.testing.helpers import claim, finish, lease_of, new_task, wait_until

__all__ = ["ConcurrencyContract"]

_RACE_DEADLINE = 60.0
"""Seconds a race may take before the test fails (it normally takes well under one)."""

_ACTIVE = frozenset({TaskStatus.PENDING, TaskStatus.RUNNING})


class ConcurrencyContract:
    """Every guarantee that must hold across store objects, not only within one."""

    @requires("shared_between_processes")
    async def test_two_store_objects_never_claim_the_same_task(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        other = await storage_factory()
        await storage.enqueue([new_task() for _ in range(400)])
        claimers = [(f"{n}{i}", s) for i in range(3) for n, s in (("a", storage), ("b", other))]
        got: dict[str, list[str]] = {worker: [] for worker, _ in claimers}
        # Rounds of simultaneous claims, half through each store, until the queue is
        # empty: every round has both stores contending.
        async with asyncio.timeout(_RACE_DEADLINE):
            while True:
                batches = await asyncio.gather(
                    *(s.claim_batch(claim(worker=w, limit=7)) for w, s in claimers)
                )
                if not any(batches):
                    break
                for (worker, _), batch in zip(claimers, batches, strict=True):
                    assert all(t.worker_id == worker for t in batch)
                    got[worker] += [t.id for t in batch]
        ids = [i for claimed in got.values() for i in claimed]
        assert len(ids) == len(set(ids)) == 400
        assert any(got[f"a{i}"] for i in range(3)) and any(got[f"b{i}"] for i in range(3))
        assert (await other.summary(TaskFilter())).running == 400

    @requires("shared_between_processes")
    async def test_two_store_objects_dedupe_to_one_leader(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        other = await storage_factory()
        async with asyncio.timeout(_RACE_DEADLINE):
            results = await asyncio.gather(
                *(
                    (storage, other)[i % 2].enqueue([new_task("t", dedupe_key="same")])
                    for i in range(40)
                )
            )
        tasks = [t for batch in results for t in batch]
        leaders = [t for t in tasks if t.alias_of is None]
        assert len(leaders) == 1
        assert all(t.alias_of == leaders[0].id for t in tasks if t is not leaders[0])
        assert [await other.get(t.id) for t in tasks] == tasks

    @requires("shared_between_processes")
    async def test_an_alias_enqueued_while_its_leader_finishes_is_never_left_behind(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        other = await storage_factory()
        for round_ in range(25):
            key = f"k{round_}"
            await storage.enqueue([new_task("t", dedupe_key=key)])
            (leader,) = await storage.claim_batch(claim("t"))
            async with asyncio.timeout(_RACE_DEADLINE):
                _, (late,) = await asyncio.gather(
                    storage.finish_batch([finish(leader, result=round_)]),
                    other.enqueue([new_task("t", dedupe_key=key)]),
                )
            current = await storage.get(late.id)
            assert current is not None
            if late.alias_of is None:  # the leader had finished: it leads now
                assert current.status is TaskStatus.PENDING
                await storage.cancel(task_ids=[late.id])
            else:  # it was an alias: it took the leader's outcome
                assert late.alias_of == leader.id
                assert current.status is TaskStatus.COMPLETED and current.result == round_

    @requires("shared_between_processes")
    async def test_a_cancel_through_one_store_reaches_the_worker_of_the_other(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        other = await storage_factory()
        await other.enqueue([new_task(), new_task(), new_task()])
        cancelled, suspended, untouched = await other.claim_batch(claim(worker="wb", limit=3))
        leases = [lease_of(t) for t in (cancelled, suspended, untouched)]
        assert await other.watch_leases(leases) == dict.fromkeys(
            (cancelled.id, suspended.id, untouched.id)
        )
        (done,) = await storage.cancel(task_ids=[cancelled.id], reason=CancelReason.USER)
        assert done.status is TaskStatus.CANCELLED and done.worker_id is None
        (asked,) = await storage.cancel(task_ids=[suspended.id], reason=CancelReason.SUSPENDED)
        assert asked.status is TaskStatus.RUNNING

        expected = {suspended.id: CancelReason.SUSPENDED, untouched.id: None}
        assert await other.watch_leases(leases) == expected
        assert await other.renew_leases(leases, 30) == expected
        # The worker behind the other store cannot overwrite the cancel, and the
        # suspended task goes back without spending its attempt.
        late, released, completed = await other.finish_batch(
            [
                finish(cancelled, result="late"),
                finish(suspended, FinishKind.FAIL, error="stopped"),
                finish(untouched, result=1),
            ]
        )
        assert late is None
        assert released is not None and released.status is TaskStatus.PENDING
        assert released.attempts == 0 and released.cancel_reason is None
        assert completed is not None and completed.status is TaskStatus.COMPLETED
        (attempt,) = await other.attempts(cancelled.id)
        assert attempt.outcome is AttemptOutcome.CANCELLED and attempt.worker_id == "wb"
        current = await other.get(cancelled.id)
        assert current is not None and current.status is TaskStatus.CANCELLED

    @requires("shared_between_processes")
    async def test_a_suspension_stored_through_one_store_stops_claims_through_the_other(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        other = await storage_factory()
        await storage.enqueue(
            [new_task("a"), new_task("a", app_id="x"), new_task("b"), new_task("b", app_id="x")]
        )
        await storage.suspend(SuspensionScope(task_type="a"))
        await storage.suspend(SuspensionScope(app_id="x"))
        assert await other.suspensions() == [
            SuspensionScope(app_id="x"),
            SuspensionScope(task_type="a"),
        ]
        # Host keys and an own key for app x: only the host's "b" task is claimable.
        got = await other.claim_batch(claim("a", "b", ("x", "a"), ("x", "b"), limit=10))
        assert [(t.task_type, t.app_id) for t in got] == [("b", None)]
        assert await other.claim_batch(claim("a", "b", ("x", "a"), ("x", "b"))) == []
        assert await other.resume(SuspensionScope(app_id="x")) is True
        got = await storage.claim_batch(claim("a", "b"))
        assert [(t.task_type, t.app_id) for t in got] == [("b", "x")]  # "a" is still suspended
        assert await storage.resume(SuspensionScope(task_type="a")) is True
        assert len(await other.claim_batch(claim("a", "b", limit=10))) == 2
        assert await storage.suspensions() == []

    @requires("shared_between_processes")
    async def test_suspending_through_one_store_asks_the_others_running_tasks_to_stop(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        other = await storage_factory()
        await other.enqueue([new_task("a", app_id="x"), new_task("a"), new_task("b", app_id="x")])
        running = await other.claim_batch(claim("a", "b", limit=3))
        assert await storage.suspend(SuspensionScope(task_type="a", app_id="x")) == 1
        assert await storage.suspend(SuspensionScope(task_type="a", app_id="x")) == 0
        watched = await other.watch_leases([lease_of(t) for t in running])
        assert watched == {
            t.id: CancelReason.SUSPENDED if (t.task_type, t.app_id) == ("a", "x") else None
            for t in running
        }

    @requires("shared_between_processes")
    async def test_a_claim_racing_a_suspension_is_reported_suspended(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        """The rule of ``claim_batch``: whichever commits first, a task claimed in a
        suspended scope is reported SUSPENDED to its worker, by both lease checks."""
        other = await storage_factory()
        for round_ in range(10):
            await storage.enqueue([new_task("a") for _ in range(5)] + [new_task("b")])
            async with asyncio.timeout(_RACE_DEADLINE):
                claimed, _ = await asyncio.gather(
                    storage.claim_batch(claim("a", "b", worker=f"w{round_}", limit=10)),
                    other.suspend(SuspensionScope(task_type="a")),
                )
            leases = [lease_of(t) for t in claimed]
            expected = {
                t.id: CancelReason.SUSPENDED if t.task_type == "a" else None for t in claimed
            }
            assert await storage.watch_leases(leases) == expected, round_
            assert await storage.renew_leases(leases, 30) == expected, round_
            await other.resume(SuspensionScope(task_type="a"))
            await storage.finish_batch([finish(t) for t in claimed])
            leftover = await storage.claim_batch(claim("a", limit=10))
            await storage.finish_batch([finish(t) for t in leftover])

    @requires("shared_between_processes")
    async def test_events_written_through_one_store_are_read_through_the_other_in_order(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        other = await storage_factory()
        _, start = await other.read_events(None)
        (task,) = await storage.enqueue([new_task()])
        (second,) = await other.enqueue([new_task("other")])
        (running,) = await other.claim_batch(claim())
        await storage.save_progress(
            [ProgressUpdate(lease=lease_of(running), progress=Progress(1, 2))]
        )
        await other.finish_batch([finish(running, FinishKind.RETRY, error="x")])
        (again,) = await storage.claim_batch(claim(worker="wa"))
        await other.finish_batch([finish(again, result="ok")])
        await storage.cancel(task_ids=[second.id])

        expected = [
            (task.id, EventKind.ENQUEUED, TaskStatus.PENDING),
            (second.id, EventKind.ENQUEUED, TaskStatus.PENDING),
            (task.id, EventKind.STARTED, TaskStatus.RUNNING),
            (task.id, EventKind.PROGRESS, TaskStatus.RUNNING),
            (task.id, EventKind.RETRYING, TaskStatus.PENDING),
            (task.id, EventKind.STARTED, TaskStatus.RUNNING),
            (task.id, EventKind.COMPLETED, TaskStatus.COMPLETED),
            (second.id, EventKind.CANCELLED, TaskStatus.CANCELLED),
        ]
        for reader in (storage, other):
            events, end = await reader.read_events(start)
            assert [(e.task.id, e.kind, e.status) for e in events] == expected
            assert end == events[-1].cursor
            paged = await read_all_events(reader, start, limit=3)
            assert [e.cursor for e in paged] == [e.cursor for e in events]

    @requires("shared_between_processes", "commit_ordered_cursors")
    async def test_a_reader_polling_while_two_stores_write_sees_every_event_once(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        """Writers through two stores commit in an order that differs from the order
        they started in; a reader polling all along still sees every event exactly once,
        in the order a reader after the fact sees them: its cursor never passes an event
        that commits later."""
        other = await storage_factory()
        reader_store = await storage_factory()
        _, start = await reader_store.read_events(None)
        writing_done = asyncio.Event()
        seen: list[str] = []

        async def reader() -> None:
            cursor = start
            while True:
                done = writing_done.is_set()
                events, cursor = await reader_store.read_events(cursor, limit=50)
                seen.extend(e.cursor for e in events)
                if done and not events:
                    return
                await asyncio.sleep(0)  # let the writers run between polls

        async def writer(target: TaskStorage, n: int) -> None:
            for i in range(15):
                await target.enqueue([new_task("w", {"n": n, "i": i}) for _ in range(1 + i % 3)])
                for task in await target.claim_batch(claim("w", worker=f"w{n}", limit=2)):
                    await target.finish_batch([finish(task)])

        async with asyncio.timeout(_RACE_DEADLINE):
            reading = asyncio.create_task(reader())
            await asyncio.gather(*(writer((storage, other)[n % 2], n) for n in range(6)))
            writing_done.set()
            await reading
        everything = await read_all_events(reader_store, start)
        assert len(everything) > 90
        assert seen == [e.cursor for e in everything]
        # Commit order is token order, across the stores that wrote them.
        assert all(a < b for a, b in zip([start, *seen], seen, strict=False))

    @requires("shared_between_processes", "transactions_across_records")
    async def test_another_store_sees_a_batch_enqueue_whole_or_not_at_all(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        other = await storage_factory()
        for round_ in range(5):
            kind = f"batch{round_}"
            observed: set[int] = set()

            async def watch(kind: str = kind, observed: set[int] = observed) -> None:
                while True:
                    total = (await other.summary(TaskFilter(task_types=(kind,)))).total
                    observed.add(total)
                    if total:
                        return
                    await asyncio.sleep(0)

            async with asyncio.timeout(_RACE_DEADLINE):
                watching = asyncio.create_task(watch())
                await asyncio.sleep(0)  # the watcher polls before and during the write
                await storage.enqueue([new_task(kind) for _ in range(200)])
                await watching
            assert observed <= {0, 200}, (round_, observed)

    @requires("shared_between_processes", "transactions_across_records")
    async def test_another_store_never_sees_a_leader_finished_before_its_aliases(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        other = await storage_factory()
        for round_ in range(5):
            key = f"k{round_}"
            await storage.enqueue([new_task("t", dedupe_key=key) for _ in range(20)])
            (leader,) = await storage.claim_batch(claim("t"))
            observed: set[tuple[bool, ...]] = set()

            async def watch(key: str = key, observed: set[tuple[bool, ...]] = observed) -> None:
                while True:
                    tasks = await other.query(TaskFilter(dedupe_key=key), limit=100)
                    state = tuple(t.status in _ACTIVE for t in tasks)
                    observed.add(state)
                    if not any(state):
                        return
                    await asyncio.sleep(0)

            async with asyncio.timeout(_RACE_DEADLINE):
                watching = asyncio.create_task(watch())
                await asyncio.sleep(0)
                await storage.finish_batch([finish(leader, result=round_)])
                await watching
            assert observed <= {(True,) * 20, (False,) * 20}, (round_, observed)

    @requires("shared_between_processes", "handler_registrations")
    async def test_concurrent_puts_of_one_registration_through_two_stores_leave_one(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        other = await storage_factory()
        urls = [f"http://host/{i}" for i in range(10)]
        async with asyncio.timeout(_RACE_DEADLINE):
            await asyncio.gather(
                *(
                    (storage, other)[i % 2].put_handler_registration(
                        HandlerRegistration("t", url, app_id="a")
                    )
                    for i, url in enumerate(urls)
                )
            )
        (found,) = await storage.handler_registrations()
        assert found.url in urls
        assert await other.handler_registrations() == [found]

    @requires("shared_between_processes", "notifications")
    async def test_a_commit_through_another_store_wakes_a_listener(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        other = await storage_factory()
        listener = await storage.change_listener()
        assert listener is not None
        try:

            async def woken_by_an_enqueue() -> bool:
                # A notification counts only once the wait has begun: should the
                # enqueue commit first, the next try waits before it enqueues.
                waiting = asyncio.create_task(listener.wait(frozenset({StoreChange.WORK}), 1))
                await asyncio.sleep(0)
                await other.enqueue([new_task()])
                return await waiting

            assert await wait_until(woken_by_an_enqueue, timeout=30)
        finally:
            await listener.close()
