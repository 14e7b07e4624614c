"""Network faults between a store and its database server (issue 16 §2).

A :class:`~tests.reliability.fault_proxy.FaultProxy` on loopback sits between the store
under test and the real server; a second store, connected directly, is the witness that
reads what was committed. For each fault: no task is lost, a commit whose reply was lost
is not applied twice, and workers recover when the network comes back.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from taskmill import Context, Taskmill, TaskStatus
from taskmill.errors import TaskmillError
from taskmill.model import AttemptOutcome, EventKind, TaskEvent
from taskmill.storage import (
    ClaimRequest,
    Finish,
    FinishKind,
    Lease,
    NewTask,
    TaskStorage,
    utcnow,
)
from taskmill.testing import wait_until

from tests.reliability.fault_proxy import FaultProxy
from tests.reliability.network import NetworkBackend, backend_params, server_address, through

pytestmark = pytest.mark.parametrize("backend", backend_params())


@pytest.fixture
def direct_url(backend: NetworkBackend, request: pytest.FixtureRequest) -> str:
    """A fresh store of this test alone, reached directly."""
    return str(request.getfixturevalue(backend.url_fixture))


@pytest.fixture
async def proxy(direct_url: str) -> AsyncIterator[FaultProxy]:
    host, port = server_address(direct_url)
    async with FaultProxy(host, port) as fault_proxy:
        yield fault_proxy


@pytest.fixture
async def witness(direct_url: str) -> AsyncIterator[Taskmill]:
    """The store reached directly: it creates the schema and reads what was committed."""
    async with Taskmill(direct_url, plugins=False) as tm:
        yield tm


def proxied_url(direct_url: str, proxy: FaultProxy, backend: NetworkBackend) -> str:
    return through(direct_url, proxy.port, backend.extra_query)


def new_task(task_type: str = "t") -> NewTask:
    return NewTask(
        id=str(uuid.uuid4()),
        task_type=task_type,
        params={"n": 1},
        params_json=json.dumps({"n": 1}),
        app_id=None,
        priority=0,
        max_retries=3,
    )


async def all_events(store: TaskStorage, after: str) -> list[TaskEvent]:
    events: list[TaskEvent] = []
    while True:
        batch, after = await store.read_events(after)
        if not batch:
            return events
        events.extend(batch)


async def claim_one(store: TaskStorage, worker_id: str = "w1") -> Lease:
    request = ClaimRequest(
        worker_id=worker_id, handlers={(None, "t"): None}, limit=1, lease_seconds=60
    )
    claimed = await store.claim_batch(request)
    assert len(claimed) == 1
    return Lease(claimed[0].id, worker_id, claimed[0].attempts)


async def test_a_finish_whose_commit_reply_was_lost_is_not_applied_twice(
    backend: NetworkBackend, direct_url: str, proxy: FaultProxy, witness: Taskmill
) -> None:
    store = witness.storage
    _, cursor = await store.read_events(None)
    [task] = await store.enqueue([new_task()])
    async with Taskmill(proxied_url(direct_url, proxy, backend), plugins=False) as tm:
        lease = await claim_one(tm.storage)
        now = utcnow()
        finish = Finish(
            lease=lease,
            kind=FinishKind.COMPLETE,
            outcome=AttemptOutcome.COMPLETED,
            started_at=now,
            finished_at=now,
            result_json='"done"',
        )
        cut = proxy.cut_reply(backend.finish_commit(), backend.reply_ends)
        try:
            [finished] = await tm.storage.finish_batch([finish])
        except TaskmillError:
            pass
        else:
            # PyMongo retries the commit; real MongoDB answers the retry with the
            # outcome (the stand-in nx-27017 answers "No session specified": raised).
            assert backend.driver_retries_commit, "a lost commit reply went unnoticed"
            assert finished is not None and finished.status is TaskStatus.COMPLETED
        assert cut.is_set(), "the proxy did not cut the commit's reply"

        # The commit was applied although its reply was lost.
        stored = await store.get(task.id)
        assert stored is not None and stored.status is TaskStatus.COMPLETED
        assert stored.result == "done"

        # The worker writes the outcome again (it cannot know): the fenced write finds
        # the lease gone and changes nothing.
        assert await tm.storage.finish_batch([finish]) == [None]

    attempts = await store.attempts(task.id)
    assert [(a.number, a.outcome) for a in attempts] == [(1, AttemptOutcome.COMPLETED)]
    kinds = [e.kind for e in await all_events(store, cursor) if e.task.id == task.id]
    assert kinds.count(EventKind.COMPLETED) == 1
    assert kinds == [EventKind.ENQUEUED, EventKind.STARTED, EventKind.COMPLETED]


async def test_an_enqueue_retried_after_a_lost_reply_runs_once_with_its_dedupe_key(
    backend: NetworkBackend, direct_url: str, proxy: FaultProxy, witness: Taskmill
) -> None:
    """The caller of an enqueue whose reply was lost cannot know it was stored, and a
    retry is a new task (the core gives it a new id): its dedupe key makes the retry an
    alias of the stored task, so the work runs once."""
    store = witness.storage
    _, cursor = await store.read_events(None)
    async with Taskmill(proxied_url(direct_url, proxy, backend), plugins=False) as tm:
        cut = proxy.cut_reply(backend.enqueue_commit(), backend.reply_ends)
        try:
            await tm.enqueue("t", {"n": 1}, dedupe_key="order-1")
        except TaskmillError:
            pass
        else:  # the driver's commit retry learned the outcome (see above)
            assert backend.driver_retries_commit, "a lost commit reply went unnoticed"
        assert cut.is_set(), "the proxy did not cut the commit's reply"
        [first] = await witness.query()
        assert first.status is TaskStatus.PENDING and first.alias_of is None

        again = await tm.enqueue("t", {"n": 1}, dedupe_key="order-1")
        assert again.id != first.id and again.alias_of == first.id

    request = ClaimRequest(worker_id="w", handlers={(None, "t"): None}, limit=10, lease_seconds=60)
    assert [t.id for t in await store.claim_batch(request)] == [first.id]
    assert await store.claim_batch(request) == []
    enqueued = [e.task.id for e in await all_events(store, cursor) if e.kind is EventKind.ENQUEUED]
    assert enqueued == [first.id, again.id]


async def test_workers_recover_from_drops_latency_black_holes_and_refusals(
    backend: NetworkBackend, direct_url: str, proxy: FaultProxy, witness: Taskmill
) -> None:
    runs: Counter[str] = Counter()
    count = 40
    async with Taskmill(proxied_url(direct_url, proxy, backend), plugins=False) as tm:

        @tm.handler("t")
        async def handler(ctx: Context, params: dict[str, int]) -> int:
            runs[ctx.task.id] += 1
            await asyncio.sleep(0.05)
            return params["n"]

        tasks = await witness.enqueue_many(
            [{"task_type": "t", "params": {"n": i}} for i in range(count)]
        )
        worker = tm.worker(
            handle_signals=False,
            concurrency=4,
            lease_seconds=3.0,
            rescue_interval=0.5,
            min_poll_interval=0.01,
        )
        running = asyncio.create_task(worker.run())

        async def done_count() -> int:
            summary = await witness.progress_summary()
            return summary.completed

        async def at_least(n: int) -> bool:
            return await done_count() >= n

        await wait_until(lambda: at_least(5), timeout=60)
        # Drop every connection, several times.
        for _ in range(3):
            proxy.drop_all()
            await asyncio.sleep(0.2)
        await wait_until(lambda: at_least(12), timeout=60)
        # Latency on every chunk.
        proxy.latency = 0.05
        await wait_until(lambda: at_least(16), timeout=60)
        proxy.latency = 0.0
        # A black hole for two seconds: nothing flows, then everything held does.
        async with proxy.black_hole():
            await asyncio.sleep(2.0)
        await wait_until(lambda: at_least(22), timeout=60)
        # The server "goes down": connections dropped and refused for two seconds.
        proxy.refusing = True
        proxy.drop_all()
        await asyncio.sleep(2.0)
        proxy.refusing = False

        async def all_done() -> bool:
            return await done_count() == count

        await wait_until(all_done, timeout=120)
        await worker.stop(grace=10)
        await running

    assert proxy.connections_dropped >= 3
    for task in tasks:
        stored = await witness.get(task.id)
        assert stored is not None and stored.status is TaskStatus.COMPLETED, stored
        attempts = await witness.attempts(task.id)
        # Every run of the handler is in the attempt log (a run whose outcome could not
        # be written is a lost attempt), and exactly one of them completed the task.
        assert len(attempts) >= runs[task.id] >= 1
        assert [a.outcome for a in attempts].count(AttemptOutcome.COMPLETED) == 1
