"""Change-stream notifications on ``mongodb://`` (nx-27017 in CI, or
``$TASKMILL_TEST_MONGO_URL``): what each kind of write reports, a worker process that
wakes on an enqueue long before its next poll, and (only when
``$TASKMILL_TEST_MONGO_RESTART`` holds the command that restarts the server) a listener
and a worker that carry on after a server restart.

The contract suite's own notification test (a commit through another store object wakes
a listener) runs in tests/test_contract_mongo.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from taskmill import Taskmill
from taskmill.errors import StorageUnavailable
from taskmill.model import CancelReason, SuspensionScope
from taskmill.storage import StoreChange
from taskmill.testing import claim, finish, new_task, wait_until
from taskmill_mongo import MongoStorage
from taskmill_mongo.listener import MongoChangeListener

from tests.test_multiprocess_sqlite import Cluster
from tests.test_server_multiprocess import SERVERS

WORK = frozenset({StoreChange.WORK})
CONTROL = frozenset({StoreChange.CONTROL})
EVENTS = frozenset({StoreChange.EVENTS})
EVERY = frozenset(StoreChange)

# The idle worker's poll interval: far beyond the deadline a notified start must meet,
# so that only a notification can explain a start within it.
LONG_POLL = 120.0
NOTIFIED_WITHIN = 30.0


@pytest.fixture
async def stores(mongo_url: str) -> AsyncIterator[tuple[MongoStorage, MongoStorage]]:
    """Two store objects on one database: one listens, the other writes."""
    listening, writing = MongoStorage.from_url(mongo_url), MongoStorage.from_url(mongo_url)
    await listening.open()
    await writing.open()
    yield listening, writing
    await writing.close()
    await listening.close()


@pytest.fixture
async def listener(stores: tuple[MongoStorage, MongoStorage]) -> AsyncIterator[MongoChangeListener]:
    made = await stores[0].change_listener()
    assert isinstance(made, MongoChangeListener)
    await made.wait(EVERY, 0)  # opens every stream: what follows is reported
    assert made.watching == {"tasks", "suspensions", "events"}
    yield made
    await made.close()


async def reported(
    listener: MongoChangeListener,
    kinds: frozenset[StoreChange],
    act: Callable[[], Awaitable[object]],
    timeout: float = 10.0,
) -> bool:
    """Whether ``act`` (a write through the other store) wakes a wait for ``kinds``."""
    waiting = asyncio.create_task(listener.wait(kinds, timeout))
    await asyncio.sleep(0)  # the wait has begun (its streams are open already)
    await act()
    return await waiting


async def settled(listener: MongoChangeListener) -> None:
    """Wait until the notifications of earlier writes have all arrived (each stream
    delivers on its own schedule): half a second passes without any."""

    async def quiet() -> bool:
        return not await listener.wait(EVERY, 0.5)

    await wait_until(quiet, timeout=30)


async def test_the_store_declares_notifications_and_gives_a_change_stream_listener(
    stores: tuple[MongoStorage, MongoStorage],
):
    store = stores[0]
    assert store.capabilities.notifications is True  # nx-27017 and MongoDB answer watch()
    listener = await store.change_listener()
    assert isinstance(listener, MongoChangeListener)
    await listener.close()
    await listener.close()  # idempotent
    assert await listener.wait(EVERY, 0.1) is False


async def test_each_kind_of_write_reports_its_kind(
    stores: tuple[MongoStorage, MongoStorage], listener: MongoChangeListener
):
    _, other = stores
    first = new_task()
    assert await reported(listener, WORK, lambda: other.enqueue([first]))
    assert await reported(listener, EVENTS, lambda: other.enqueue([new_task()]))

    # A claim and a finish make nothing claimable and ask nothing to stop: they are
    # filtered out (claims by the server on MongoDB, by the listener on the stand-in).
    claimed = []
    await settled(listener)

    async def claim_one() -> None:
        claimed.extend(await other.claim_batch(claim(limit=1)))

    assert not await reported(listener, WORK | CONTROL, claim_one, 1)
    (running,) = claimed
    await settled(listener)
    assert not await reported(
        listener, WORK | CONTROL, lambda: other.finish_batch([finish(running)]), 1
    )

    # A stop request reaches a running task's worker; a cancel ends it.
    (held,) = await other.claim_batch(claim())
    assert held.id != running.id
    stop = [held.id]
    assert await reported(
        listener, CONTROL, lambda: other.cancel(task_ids=stop, reason=CancelReason.SHUTDOWN)
    )
    assert await reported(listener, CONTROL, lambda: other.cancel(task_ids=stop))

    # A suspension asks running tasks to stop; its resumption makes tasks claimable.
    scope = SuspensionScope(task_type="job")
    assert await reported(listener, CONTROL, lambda: other.suspend(scope))
    assert await reported(listener, WORK, lambda: other.resume(scope))

    # A dependency's end releases its dependent ($unset of waiting_on).
    dependency = new_task("dep")
    dependent = new_task("dep", after=(dependency.id,))
    await other.enqueue([dependency])
    await other.enqueue([dependent])
    (ran,) = await other.claim_batch(claim("dep"))
    assert ran.id == dependency.id
    assert await reported(listener, WORK, lambda: other.finish_batch([finish(ran)]))
    (released,) = await other.claim_batch(claim("dep"))
    assert released.id == dependent.id


async def test_streams_opened_during_another_stores_aborted_transaction_still_report(
    stores: tuple[MongoStorage, MongoStorage],
):
    """With ``serializeWrites`` (the nx-27017 stand-in's option), the listener opens its
    streams under the writer lock. The stand-in installs a collection's change triggers
    when its first stream opens, inside whatever transaction is open on the database;
    a stream opened during a transaction that then aborts reported nothing, ever (found
    as a worker that now and then never heard of an enqueue)."""
    listening, writing = stores
    conn = writing._conn
    if not conn.options.serialize_writes:
        pytest.skip("a server with isolated transactions (MongoDB) needs no writer lock")
    db = conn.database()
    token = await conn.writer_lock.acquire(db)  # as every transaction of a store takes it
    client = conn.new_client()
    try:
        async with client.start_session() as session:
            await session.start_transaction()
            await client[db.name].counters.insert_one({"_id": "probe"}, session=session)
            made = await listening.change_listener()
            assert isinstance(made, MongoChangeListener)
            opening = asyncio.create_task(made.wait(WORK, 0))  # opens the WORK streams
            await asyncio.sleep(0.5)  # without the lock, they open now, in the transaction
            await session.abort_transaction()
    finally:
        await conn.writer_lock.release(db, token)
        await client.close()
    try:
        await asyncio.wait_for(opening, 30)
        assert made.watching == {"tasks", "suspensions"}
        assert await reported(made, WORK, lambda: writing.enqueue([new_task()]))
    finally:
        await made.close()


async def test_a_wait_for_events_opens_only_the_events_stream(
    stores: tuple[MongoStorage, MongoStorage],
):
    listening, other = stores
    events_only = await listening.change_listener()
    assert isinstance(events_only, MongoChangeListener)
    try:
        # Opening a stream reports a change of its kinds: a caller may have looked
        # before it opened, and what committed meanwhile is not in it.
        assert await events_only.wait(EVENTS, 10)
        assert events_only.watching == {"events"}
        assert await reported(events_only, EVENTS, lambda: other.enqueue([new_task()]))
        assert events_only.watching == {"events"}
    finally:
        await events_only.close()


# -- a worker process -------------------------------------------------------------------


@pytest.fixture
def cluster(mongo_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(mongo_url, tmp_path / "runs.log")
    yield c
    c.close()  # kills (by pid) and reaps every worker it started


def idle_worker(cluster: Cluster) -> subprocess.Popen[bytes]:
    return cluster.start("--poll-interval", str(LONG_POLL), "--min-poll-interval", str(LONG_POLL))


async def started_after_enqueue(cluster: Cluster, url: str) -> float:
    """Enqueue a task and wait until the worker runs it; the seconds it took."""
    before = len(cluster.lines("ran"))
    async with Taskmill(url, plugins=False) as tm:
        enqueued = time.monotonic()
        task = await tm.enqueue("record")

    async def ran() -> bool:
        return any(row[0] == task.id for row in cluster.lines("ran")[before:])

    await _waited_for_the_worker(cluster, ran, NOTIFIED_WITHIN)
    return time.monotonic() - enqueued


async def _waited_for_the_worker(
    cluster: Cluster, probe: Callable[[], Awaitable[bool]], timeout: float
) -> None:
    """``wait_until(probe)``; a failure shows what the worker processes printed."""
    try:
        await wait_until(probe, timeout=timeout, interval=0.01)
    except AssertionError as failed:
        printed = "\n".join(cluster.output(proc)[-4000:] for proc in cluster.procs)
        raise AssertionError(f"{failed}; the workers printed:\n{printed}") from None


async def warmed_up(cluster: Cluster, url: str) -> None:
    """The worker ran a task (picked up by its first claim or by a notification, so it
    has claimed, found nothing more and is waiting on its listener) and has had a
    moment to settle into its idle wait."""

    async def ready() -> bool:
        return bool(cluster.lines("worker-ready"))

    await wait_until(ready, timeout=60)
    async with Taskmill(url, plugins=False) as tm:
        await tm.enqueue("record")

    async def ran() -> bool:
        return bool(cluster.lines("ran"))

    await _waited_for_the_worker(cluster, ran, 60)
    await asyncio.sleep(1)


@pytest.mark.slow
async def test_an_idle_worker_process_starts_an_enqueued_task_long_before_its_poll(
    cluster: Cluster, mongo_url: str
):
    idle_worker(cluster)
    await warmed_up(cluster, mongo_url)
    # Polling alone would start these only after LONG_POLL seconds; the wait fails
    # past NOTIFIED_WITHIN.
    took = [await started_after_enqueue(cluster, mongo_url) for _ in range(3)]
    assert max(took) < NOTIFIED_WITHIN, took


# -- a server restart -------------------------------------------------------------------


async def _reachable(url: str) -> bool:
    try:
        async with Taskmill(url, plugins=False) as tm:
            await tm.progress_summary()
    except StorageUnavailable:
        return False
    return True


@pytest.mark.slow
@pytest.mark.restarts_server(SERVERS["mongo"].restart_variable)
async def test_the_listener_and_an_idle_worker_carry_on_after_a_server_restart(
    cluster: Cluster, mongo_url: str, stores: tuple[MongoStorage, MongoStorage]
):
    listening, other = stores
    listener = await listening.change_listener()
    assert isinstance(listener, MongoChangeListener)
    try:
        await listener.wait(EVERY, 0)
        idle_worker(cluster)
        await warmed_up(cluster, mongo_url)

        restarted = await asyncio.to_thread(
            subprocess.run,
            ["bash", "-c", os.environ[SERVERS["mongo"].restart_variable]],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert restarted.returncode == 0, restarted.stderr
        await wait_until(lambda: _reachable(mongo_url), timeout=60, interval=0.2)

        # The listener carries on: the driver resumes a stream from its token by itself
        # when the server is back within its selection timeout; otherwise the listener
        # reopens it (and reports a change of every kind). Either way it reports what
        # is written afterwards.
        async def woken_by_an_enqueue() -> bool:
            try:
                return await reported(listener, WORK, lambda: other.enqueue([new_task()]), 2)
            except StorageUnavailable:
                return False  # the writer's pooled connections died with the server

        await wait_until(woken_by_an_enqueue, timeout=60)

        # The worker process's listener too: a new task starts long before its poll.
        took = await started_after_enqueue(cluster, mongo_url)
        assert took < NOTIFIED_WITHIN, took
    finally:
        await listener.close()
