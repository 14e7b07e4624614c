"""MongoDB's transaction runner and event log, beyond the storage contract.

**The write-conflict paths.** On a replica set, concurrent transactions abort with
errors labelled ``TransientTransactionError`` (rerun the whole transaction) and commits
fail with ``UnknownTransactionCommitResult`` (commit again). No replica set is reachable
in the tests and the test server never raises them, so they are injected: the store's
transaction runner calls its fault seam (``Connection.fault``) after the body ran and
before each commit, and the tests raise there the driver's own error carrying the
label, as PyMongo raises it from a server reply. Everything else is the real server.

**Event order without a hot document.** Events take their positions from one of several
shard counters, stamped (see taskmill_mongo/transactions.py); these tests check what
the contract suite cannot see: that the shards are used, that the log reads back in
commit order across them, that a reader writes the other shards once per newer event
and an idle poll writes nothing, and that a log written before the shards (integer
positions) is read before the new one.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import attrs
import pytest
from pymongo import AsyncMongoClient
from pymongo.errors import OperationFailure, PyMongoError
from taskmill.cursors import position_token
from taskmill.errors import StorageUnavailable
from taskmill.model import EventKind, TaskFilter, TaskStatus
from taskmill.testing import claim, finish, new_task
from taskmill.testing.events import read_all_events
from taskmill_mongo.connection import Stage
from taskmill_mongo.documents import EventKey
from taskmill_mongo.options import parse_url
from taskmill_mongo.schema import EVENT_SHARDS, SHARDS
from taskmill_mongo.storage import MongoStorage

from tests import mongo_server

Doc = dict[str, Any]


def labelled(message: str, code: int, name: str, label: str) -> OperationFailure:
    """The error PyMongo raises for a server reply refusing a command with ``label``."""
    reply = {"ok": 0, "errmsg": message, "code": code, "codeName": name, "errorLabels": [label]}
    return OperationFailure(message, code=code, details=reply)


def write_conflict() -> OperationFailure:
    """What a MongoDB replica set answers a transaction that conflicted."""
    return labelled(
        "Write conflict during plan execution and yielding is disabled.",
        112,
        "WriteConflict",
        "TransientTransactionError",
    )


def unknown_commit_result() -> OperationFailure:
    """What a commit gets when the primary stepped down before answering."""
    return labelled(
        "operation was interrupted because the primary stepped down",
        189,
        "PrimarySteppedDown",
        "UnknownTransactionCommitResult",
    )


@attrs.define
class Faults:
    """What the fault seam does: raise the next error queued for the stage reached
    (``always``: one for every time), and count the stages reached."""

    queued: dict[Stage, list[PyMongoError]] = attrs.field(factory=dict)
    always: dict[Stage, Callable[[], PyMongoError]] = attrs.field(factory=dict)
    reached: Counter[Stage] = attrs.field(factory=Counter)

    def __call__(self, stage: Stage) -> None:
        self.reached[stage] += 1
        if stage in self.always:
            raise self.always[stage]()
        queue = self.queued.get(stage)
        if queue:
            raise queue.pop(0)


async def opened(url: str, **options: Any) -> MongoStorage:
    store = MongoStorage.from_url(url, **options)
    await store.open()
    return store


@pytest.fixture
async def store(mongo_url: str) -> AsyncIterator[MongoStorage]:
    store = await opened(mongo_url)
    yield store
    await store.close()


@pytest.fixture
async def raw(mongo_database: str) -> AsyncIterator[Any]:
    """The test's database through a plain PyMongo client."""
    client: AsyncMongoClient[Doc] = AsyncMongoClient(
        mongo_server.driver_url(), serverSelectionTimeoutMS=5000
    )
    yield client[mongo_database]
    await client.close()


def inject(store: MongoStorage, faults: Faults) -> Faults:
    store._conn.fault = faults
    return faults


async def event_kinds(store: MongoStorage, task_id: str) -> list[EventKind]:
    return [e.kind for e in await read_all_events(store, position_token(0)) if e.task.id == task_id]


# -- the write-conflict paths -------------------------------------------------------------


async def test_a_write_conflict_reruns_the_whole_claim_and_it_is_applied_once(
    store: MongoStorage,
) -> None:
    (task,) = await store.enqueue([new_task()])
    faults = inject(store, Faults(queued={Stage.BODY: [write_conflict()]}))
    (claimed,) = await store.claim_batch(claim())
    assert faults.reached == {Stage.BODY: 2, Stage.COMMIT: 1}
    assert claimed.id == task.id and claimed.attempts == 1
    assert await store.get(task.id) == claimed
    assert await event_kinds(store, task.id) == [EventKind.ENQUEUED, EventKind.STARTED]


async def test_a_transient_error_at_commit_reruns_the_whole_finish_and_it_is_applied_once(
    store: MongoStorage,
) -> None:
    await store.enqueue([new_task()])
    (running,) = await store.claim_batch(claim())
    faults = inject(store, Faults(queued={Stage.COMMIT: [write_conflict()]}))
    (done,) = await store.finish_batch([finish(running, result={"n": 1})])
    assert faults.reached == {Stage.BODY: 2, Stage.COMMIT: 2}
    assert done is not None and done.status is TaskStatus.COMPLETED
    assert len(await store.attempts(running.id)) == 1
    assert await event_kinds(store, running.id) == [
        EventKind.ENQUEUED,
        EventKind.STARTED,
        EventKind.COMPLETED,
    ]


async def test_an_unknown_commit_result_commits_again_without_rerunning_the_body(
    store: MongoStorage,
) -> None:
    faults = inject(
        store,
        Faults(queued={Stage.COMMIT: [unknown_commit_result(), unknown_commit_result()]}),
    )
    (task,) = await store.enqueue([new_task()])
    assert faults.reached == {Stage.BODY: 1, Stage.COMMIT: 3}
    store._conn.fault = None
    assert [t.id for t in await store.query(TaskFilter(), limit=10)] == [task.id]
    assert await event_kinds(store, task.id) == [EventKind.ENQUEUED]


async def test_an_error_without_a_retry_label_is_not_retried(store: MongoStorage) -> None:
    refused = OperationFailure("not authorized", code=13, details={"ok": 0, "code": 13})
    faults = inject(store, Faults(queued={Stage.BODY: [refused]}))
    with pytest.raises(StorageUnavailable, match="not authorized") as excinfo:
        await store.enqueue([new_task()])
    assert excinfo.value.__cause__ is refused
    assert faults.reached == {Stage.BODY: 1}
    assert await store.query(TaskFilter()) == []


async def test_a_lasting_transient_error_is_unavailable_and_nothing_is_written(
    mongo_url: str,
) -> None:
    store = await opened(mongo_url, connect_timeout=1)
    try:
        faults = inject(store, Faults(always={Stage.BODY: write_conflict}))
        started = time.monotonic()
        with pytest.raises(StorageUnavailable) as excinfo:
            await store.enqueue([new_task()])
        elapsed = time.monotonic() - started
        message = str(excinfo.value)
        assert "transient error" in message and "1 s (connect_timeout)" in message
        assert "nothing of it was written" in message
        assert isinstance(excinfo.value.__cause__, OperationFailure)
        assert excinfo.value.__cause__.has_error_label("TransientTransactionError")
        assert faults.reached[Stage.BODY] > 2 and Stage.COMMIT not in faults.reached
        assert 1 <= elapsed < 10
        store._conn.fault = None
        assert await store.query(TaskFilter()) == []
        assert await read_all_events(store, position_token(0)) == []
    finally:
        await store.close()


async def test_a_lasting_unknown_commit_result_is_unavailable_saying_it_may_be_applied(
    mongo_url: str,
) -> None:
    store = await opened(mongo_url, connect_timeout=1)
    try:
        faults = inject(store, Faults(always={Stage.COMMIT: unknown_commit_result}))
        with pytest.raises(StorageUnavailable, match="may have been applied") as excinfo:
            await store.enqueue([new_task()])
        assert "unknown commit result" in str(excinfo.value)
        assert isinstance(excinfo.value.__cause__, OperationFailure)
        assert faults.reached[Stage.BODY] == 1 and faults.reached[Stage.COMMIT] > 2
        store._conn.fault = None
        # Here the commit was never sent: the transaction was aborted.
        assert await store.query(TaskFilter()) == []
    finally:
        await store.close()


# -- event order without a hot document ---------------------------------------------------


def shard_of(event_id: Any) -> int:
    return EventKey.from_document_id(event_id).shard


async def test_events_spread_over_the_shards_read_back_in_commit_order(
    store: MongoStorage, raw: Any
) -> None:
    _, start = await store.read_events(None)
    enqueued = [(await store.enqueue([new_task(params={"i": i})]))[0] for i in range(24)]
    shards = {shard_of(d["_id"]) async for d in raw.events.find({}, {"_id": 1})}
    assert len(shards) > 1, "every transaction took the same shard"
    assert shards <= set(range(EVENT_SHARDS))
    for page in (1000, 5):
        events = await read_all_events(store, start, limit=page)
        assert [e.task.id for e in events] == [t.id for t in enqueued]
        cursors = [e.cursor for e in events]
        assert all(a < b for a, b in zip([start, *cursors], cursors, strict=False))


async def closings(raw: Any) -> dict[str, int]:
    return {d["_id"]: d.get("closed", 0) async for d in raw.counters.find({"_id": {"$in": SHARDS}})}


async def test_a_reader_closes_the_other_shards_once_per_newer_event_and_idle_reads_write_nothing(
    store: MongoStorage, raw: Any
) -> None:
    (task,) = await store.enqueue([new_task()])
    (event,) = await raw.events.find({"task_id": task.id}).to_list()
    written_on = SHARDS[shard_of(event["_id"])]
    before = await closings(raw)
    _, newest = await store.read_events(None)
    assert EventKey.from_token(newest) == EventKey.from_document_id(event["_id"])
    after = await closings(raw)
    assert after == {name: count + (name != written_on) for name, count in before.items()}, (
        "the other shards are written once, the newest event's shard not"
    )
    assert await store.read_events(newest) == ([], newest)
    assert await store.read_events(None) == ([], newest)
    assert await closings(raw) == after, "a read with nothing newer wrote"


async def test_an_event_log_written_before_the_shards_is_read_before_the_new_one(
    store: MongoStorage, raw: Any
) -> None:
    first, second = await store.enqueue([new_task(), new_task()])
    # The database as a release before the shards left it: events numbered by the
    # ``events`` counter, with integer ids, and no other shard documents.
    await raw.events.delete_many({})
    await raw.counters.delete_many({"_id": {"$in": SHARDS[1:]}})
    await raw.counters.replace_one({"_id": "events"}, {"_id": "events", "value": 2})
    at = int(datetime.now(UTC).timestamp() * 1_000_000)
    await raw.events.insert_many(
        [
            {"_id": n, "kind": "enqueued", "task_id": t.id, "status": "pending", "at": at}
            for n, t in ((1, first), (2, second))
        ]
    )
    reopened = await opened(store.url)
    try:
        _, newest = await reopened.read_events(None)
        assert newest == position_token(2)
        assert await raw.counters.count_documents({"_id": {"$in": SHARDS}}) == EVENT_SHARDS
        (running,) = await reopened.claim_batch(claim(limit=1))
        events = await read_all_events(reopened, position_token(0), limit=1)
        assert [(e.task.id, e.kind) for e in events] == [
            (first.id, EventKind.ENQUEUED),
            (second.id, EventKind.ENQUEUED),
            (running.id, EventKind.STARTED),
        ]
        cursors = [e.cursor for e in events]
        assert cursors[:2] == [position_token(1), position_token(2)]
        assert cursors[1] < cursors[2], "a stamped cursor sorts after every numbered one"
        assert await reopened.read_events(position_token(2)) == ([events[2]], cursors[2])
    finally:
        await reopened.close()


async def test_a_server_without_cluster_time_needs_serialize_writes(mongo_url: str) -> None:
    """nx-27017 reports no ``operationTime``, which stamps events on MongoDB: without
    ``serializeWrites`` (which stamps them with the writer lock's turn) it is refused,
    saying so. (Skipped against a server that reports it.)"""
    options = parse_url(mongo_url, {})
    client: AsyncMongoClient[Doc] = AsyncMongoClient(
        options.driver_url, serverSelectionTimeoutMS=5000
    )
    try:
        reply = await client[options.database].command("ping")
    finally:
        await client.close()
    if "operationTime" in reply:
        pytest.skip("the test server reports cluster time")
    store = MongoStorage.from_url(
        mongo_url.replace("serializeWrites=true", "serializeWrites=false")
    )
    try:
        with pytest.raises(StorageUnavailable, match="no cluster time") as excinfo:
            await store.open()
        assert "serializeWrites=true" in str(excinfo.value)
    finally:
        await store.close()
