"""Running an operation: every change is one multi-document transaction; what a
transaction writes besides the tasks it decides on (events, attempt rows); and reading
the event log back in commit order.

**The runner** (:func:`transaction`) follows the driver's rules for transactions (the
convenient API of the transactions specification, as ``with_transaction`` does): an
error labelled ``TransientTransactionError`` (a write conflict, a failover) aborts and
reruns the whole transaction; a commit that fails with ``UnknownTransactionCommitResult``
is committed again (the server applies a transaction once, however often it is
committed). Where ``with_transaction`` retries for 120 s, this runner retries for the
store's ``connect_timeout`` and then raises
:class:`~taskmill.errors.StorageUnavailable`. Each changed task document is written
back fenced by the (status, attempts, worker id) it was read in (:func:`replace`): a
fence that matched nothing (a race lost on a server without snapshot isolation) runs
the body again (:class:`Raced`).

**The event log** has no document that every writer writes. A transaction that records
events takes their positions from one of :data:`EVENT_SHARDS` counter documents, picked
at random, and raises that shard's ``stamp`` to its own stamp: the cluster time of its
operations (``operationTime``, known before it commits). An event's place is
:class:`~taskmill_mongo.documents.EventKey` ``(stamp, shard, position)``, its ``_id``
the cursor token. Within a shard, positions follow commit order (two transactions that
take positions of one shard write one document, so the later aborts until the earlier
has committed) and stamps never decrease. Across shards, a transaction that starts after
another committed (and so one that reads a task another wrote) has a greater stamp. A
reader (:func:`read_log`) reads every shard's newest key; before it reads up to the
newest of them, it writes every other shard document once, which waits for a
transaction holding one to end and makes any that started earlier and has not taken
its positions yet conflict and run again, with a later stamp. So no event commits
later with a key below what a reader has read. See docs/backends/mongodb.md, "Event
cursors in commit order".

With ``serialize_writes`` (the test stand-in, which reports no cluster time and does not
isolate concurrent transactions) every transaction and every read runs under the
:mod:`~taskmill_mongo.writer_lock`, each transaction opens with a write, and events are
stamped with the lock's turn instead of the cluster time. Nothing else differs.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from typing import Any, Final, TypeVar

import attrs
from bson import Timestamp
from pymongo import DeleteMany, DeleteOne, InsertOne, ReplaceOne, ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure, PyMongoError
from taskmill.errors import StorageUnavailable
from taskmill.model import Attempt, EventKind, Task, TaskStatus

from taskmill_mongo.connection import Connection, Stage
from taskmill_mongo.documents import EventKey, micros, task_document, tombstone
from taskmill_mongo.options import redact
from taskmill_mongo.schema import DEPENDENTS, EVENT_SHARDS, SHARDS, WAITING, Doc, create_counters

__all__ = [
    "Nothing",
    "Raced",
    "Writes",
    "check_transactions",
    "flush",
    "outside_transactions",
    "read",
    "read_log",
    "record",
    "replace",
    "reserve",
    "transaction",
]

T = TypeVar("T")

_RACE_RETRIES: Final = 20
_TRANSIENT: Final = "TransientTransactionError"
_UNKNOWN_COMMIT: Final = "UnknownTransactionCommitResult"
_MAX_TIME_MS_EXPIRED: Final = 50
"""A commit that ran out of ``maxTimeMS``: not retried, as the specification says."""
_BACKOFF_FIRST: Final = 0.005
_BACKOFF_MOST: Final = 0.5
_OLDEST_STAMPED: Final = EventKey(1, 0, 0)
"""Below every stamped event (positions start at 1), above every unstamped one."""

_RUNNING: ContextVar[Connection] = ContextVar("taskmill_mongo_transaction")
"""The store whose transaction the current task is running (for :func:`record`)."""


class Nothing(Exception):
    """A transaction found nothing to write: it ends (aborted, as it wrote nothing)
    with this value."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


class Raced(Exception):
    """A fenced write matched nothing: the transaction runs again on fresh reads."""


async def transaction(conn: Connection, body: Callable[[AsyncClientSession], Awaitable[T]]) -> T:
    """Run ``body`` in a transaction with the driver's retry rules; a fenced write that
    lost a race (or a dedupe leader inserted meanwhile) runs it again.

    :raises StorageUnavailable: the server is unreachable; a transient error or an
        unknown commit result lasted past ``connect_timeout``; or the body lost a race
        ``_RACE_RETRIES`` times in a row.
    :raises InvalidParams: a document written was over the server's largest size.
    """
    db = conn.database()
    client = db.client

    async def opened(s: AsyncClientSession) -> T:
        if conn.options.serialize_writes:
            # nx-27017 (the test stand-in) starts a transaction only on a write.
            await db.counters.update_one({"_id": SHARDS[0]}, {"$inc": {"value": 0}}, session=s)
        return await body(s)

    async def run() -> T:
        running = _RUNNING.set(conn)
        try:
            if not conn.options.serialize_writes:
                return await attempts()
            token = await conn.writer_lock.acquire(db)
            try:
                return await attempts()
            finally:
                await asyncio.shield(conn.writer_lock.release(db, token))
        finally:
            _RUNNING.reset(running)

    async def attempts() -> T:
        for _ in range(_RACE_RETRIES):
            async with client.start_session() as session:
                try:
                    return await _committed(conn, session, opened)
                except Nothing as nothing:
                    return nothing.value  # type: ignore[no-any-return]
                except (Raced, DuplicateKeyError):
                    await asyncio.sleep(0.005)
                except BulkWriteError as exc:
                    errors = exc.details.get("writeErrors", [])
                    if not errors or any(e.get("code") != 11000 for e in errors):
                        raise
                    await asyncio.sleep(0.005)  # a dedupe leader inserted meanwhile
        raise StorageUnavailable(
            f"MongoDB at {redact(conn.url)}: a transaction lost {_RACE_RETRIES} races "
            "in a row to concurrent writers; try again"
        )

    return await conn.guard(run())


async def _committed(
    conn: Connection, s: AsyncClientSession, body: Callable[[AsyncClientSession], Awaitable[T]]
) -> T:
    """Run ``body`` in a transaction on ``s`` and commit it: rerun whole after an error
    labelled ``TransientTransactionError``, commit again after one labelled
    ``UnknownTransactionCommitResult``, for at most ``connect_timeout`` seconds.

    :raises StorageUnavailable: such an error lasted past ``connect_timeout``.
    """
    deadline = time.monotonic() + conn.options.connect_timeout
    pause = _Pause()
    while True:
        await s.start_transaction()
        try:
            result = await body(s)
            _fault(conn, Stage.BODY)
        except BaseException as exc:
            if s.in_transaction:
                await s.abort_transaction()
            if not (isinstance(exc, PyMongoError) and exc.has_error_label(_TRANSIENT)):
                raise
            failure = exc
        else:
            rerun = await _commit(conn, s, deadline, pause)
            if rerun is None:
                return result
            failure = rerun
        if time.monotonic() >= deadline:
            raise _gave_up(conn, failure, _GAVE_UP_TRANSIENT) from failure
        await pause()


async def _commit(
    conn: Connection, s: AsyncClientSession, deadline: float, pause: _Pause
) -> PyMongoError | None:
    """Commit the transaction on ``s``: None once committed, or the transient error
    after which the whole transaction runs again (it is aborted).

    :raises StorageUnavailable: the commit's result stayed unknown past ``deadline``.
    """
    while True:
        try:
            _fault(conn, Stage.COMMIT)
            await s.commit_transaction()
            return None
        except PyMongoError as exc:
            expired = isinstance(exc, OperationFailure) and exc.code == _MAX_TIME_MS_EXPIRED
            if exc.has_error_label(_UNKNOWN_COMMIT) and not expired:
                if time.monotonic() < deadline:
                    await pause()
                    continue  # committed again: the server applies it once
                if s.in_transaction:
                    await s.abort_transaction()
                raise _gave_up(conn, exc, _GAVE_UP_UNKNOWN) from exc
            if not exc.has_error_label(_TRANSIENT):
                raise
            if s.in_transaction:
                await s.abort_transaction()
            return exc


class _Pause:
    """Jittered exponential backoff between retries, as the driver's."""

    def __init__(self) -> None:
        self.most = _BACKOFF_FIRST

    async def __call__(self) -> None:
        await asyncio.sleep(random.uniform(0, self.most))
        self.most = min(self.most * 2, _BACKOFF_MOST)


def _fault(conn: Connection, stage: Stage) -> None:
    if conn.fault is not None:
        conn.fault(stage)


_GAVE_UP_TRANSIENT: Final = (
    "a transient error (a write conflict, a failover)",
    "nothing of it was written; try again",
)
_GAVE_UP_UNKNOWN: Final = (
    "an unknown commit result",
    "it may have been applied: check before you repeat it",
)


def _gave_up(conn: Connection, exc: PyMongoError, what: tuple[str, str]) -> StorageUnavailable:
    met, advice = what
    message = str(exc).replace(conn.url, redact(conn.url))
    return StorageUnavailable(
        f"MongoDB at {redact(conn.url)}: a transaction still met {met} after "
        f"{conn.options.connect_timeout:g} s (connect_timeout) of retries ({message}); "
        f"{advice}"
    )


async def read(conn: Connection, work: Coroutine[Any, Any, T]) -> T:
    """Run a read; with ``serialize_writes`` under the writer lock, since such a
    server shows other clients' uncommitted writes."""
    if not conn.options.serialize_writes:
        return await conn.guard(work)
    try:
        return await conn.guard(outside_transactions(conn, work))
    finally:
        work.close()


async def outside_transactions(conn: Connection, work: Awaitable[T]) -> T:
    """Run ``work``, with ``serialize_writes`` under the writer lock: every transaction
    of every store holds it, so none is open on the server meanwhile. Errors are
    ``work``'s own (no :meth:`Connection.guard`)."""
    if not conn.options.serialize_writes:
        return await work
    db = conn.database()
    token = await conn.writer_lock.acquire(db)
    try:
        return await work
    finally:
        await asyncio.shield(conn.writer_lock.release(db, token))


async def check_transactions(conn: Connection, db: AsyncDatabase[Doc]) -> None:
    """Refuse a server that cannot run multi-document transactions (a standalone
    mongod), probed with one, so any server that runs them is served; and, unless
    ``serialize_writes``, one that reports no cluster time (``operationTime``), which
    stamps events.

    :raises StorageUnavailable: saying how to run the server as a replica set.
    """
    try:

        async def probe(session: AsyncClientSession) -> None:
            await db.counters.update_one(
                {"_id": SHARDS[0]},
                {"$setOnInsert": {"value": 0}},
                upsert=True,
                session=session,
            )

        token = await conn.writer_lock.acquire(db) if conn.options.serialize_writes else None
        try:
            async with db.client.start_session() as session:
                await session.with_transaction(probe)
                reported = session.operation_time is not None
        finally:
            if token is not None:
                await asyncio.shield(conn.writer_lock.release(db, token))
    except OperationFailure as exc:
        if exc.code == 20 or "replica set" in str(exc) or "Transaction" in str(exc):
            raise StorageUnavailable(
                f"the MongoDB server at {redact(conn.url)} cannot run multi-document "
                "transactions, which taskmill needs: it is a standalone server. Run "
                "it as a replica set (a single member will do: start mongod with "
                "--replSet rs0 and run rs.initiate()) or connect through mongos"
            ) from exc
        raise
    if not reported and not conn.options.serialize_writes:
        raise StorageUnavailable(
            f"the server at {redact(conn.url)} runs transactions but reports no cluster "
            "time (operationTime), which taskmill-mongo orders its event log by: connect "
            "to a MongoDB replica set member or mongos (a test stand-in such as nx-27017 "
            "needs ?serializeWrites=true)"
        )


@attrs.define
class Writes:
    """What one transaction writes besides task documents: events and log rows."""

    events: list[tuple[EventKind, str, TaskStatus]] = attrs.field(factory=list)
    attempts: list[Attempt] = attrs.field(factory=list)
    replacements: list[tuple[Doc, Doc]] | None = None
    """When a list, the fenced task replacements not sent yet, as (fence, document):
    the transaction sends them as one ``bulk_write`` (:func:`flush`) before it next
    reads task documents and before it records; None: each is written at once."""
    forgotten: dict[str, Doc] = attrs.field(factory=dict)
    """The ended tasks to delete (a finish with ``Finish.delete`` and the aliases it
    settled; :meth:`~taskmill_mongo.settlement.MongoLedger.forget`), by id: the
    documents last written for them. :func:`record` deletes them with their attempt
    rows and keeps each document as the task's tombstone."""
    unlogged: set[str] = attrs.field(factory=set)
    """Those of :attr:`forgotten` known to have no attempt rows (their documents were
    read with :data:`~taskmill_mongo.schema.UNLOGGED`)."""

    def emit(self, kind: EventKind, t: Task) -> None:
        self.events.append((kind, t.id, t.status))


async def reserve(db: AsyncDatabase[Doc], s: AsyncClientSession, counter: str, count: int) -> int:
    """Take ``count`` consecutive positions of ``counter``; the first of them."""
    doc = await db.counters.find_one_and_update(
        {"_id": counter},
        {"$inc": {"value": count}},
        upsert=True,
        return_document=ReturnDocument.AFTER,
        session=s,
    )
    assert doc is not None
    return int(doc["value"]) - count + 1


async def record(db: AsyncDatabase[Doc], s: AsyncClientSession, writes: Writes, now: int) -> None:
    """Send what ``writes`` holds back, then append its events (at positions of an
    event shard, :func:`_reserve_events`) and its attempt log rows; the tasks it
    forgot are deleted in the same round trip as the replacements (:func:`_forget`)."""
    deleting: list[Doc] = []
    if writes.forgotten:
        deleting = await _forget(db, s, writes, now)
    else:
        await flush(db, s, writes)
    if writes.events:
        first = await _reserve_events(db, s, len(writes.events))
        await db.events.insert_many(
            [
                {
                    "_id": attrs.evolve(first, position=first.position + i).document_id(),
                    "kind": k.value,
                    "task_id": tid,
                    "status": st.value,
                    "at": now,
                }
                for i, (k, tid, st) in enumerate(writes.events)
            ],
            session=s,
        )
    if writes.attempts or deleting:
        rows = [
            {
                "task_id": a.task_id,
                "number": a.number,
                "seq": now,
                "worker_id": a.worker_id,
                "started_at": micros(a.started_at),
                "finished_at": micros(a.finished_at),
                "outcome": a.outcome.value,
                "error": a.error,
            }
            for a in writes.attempts
        ]
        if not deleting:
            await db.attempts.insert_many(rows, session=s)
        else:  # the deleted tasks' rows go, these come: one round trip
            ops = [*(DeleteMany(q) for q in deleting), *(InsertOne(row) for row in rows)]
            await db.attempts.bulk_write(ops, ordered=True, session=s)


async def _forget(
    db: AsyncDatabase[Doc], s: AsyncClientSession, writes: Writes, now: int
) -> list[Doc]:
    """Delete the tasks ``writes`` forgot, keeping their last documents as tombstones;
    the queries of ``attempts`` that delete their attempt rows (for :func:`record`).

    A forgotten task whose replacement is still held back is deleted instead, fenced
    as the replacement was; one written earlier (in this transaction) is deleted by id.
    The held-back replacements then the deletes are one ``bulk_write`` (one command for
    the deletes, and one for the replacements of a batch that also keeps tasks: the
    driver sends each run of one kind as a command), and a fence that matched nothing
    is a lost race (:class:`Raced`), as in :func:`flush`. One ``bulk_write`` of upserts
    then writes the tombstones: a task id enqueued again after its task was deleted
    (the duplicate-id rule looks only at ``tasks``) and deleted again replaces its
    tombstone, as the reference store does."""
    doomed = writes.forgotten
    pending = writes.replacements or []
    if writes.replacements is not None:
        writes.replacements = []
    last = {doc["_id"]: i for i, (_, doc) in enumerate(pending) if doc["_id"] in doomed}
    ops: list[ReplaceOne[Doc] | DeleteOne] = [
        ReplaceOne(fence, doc)
        for i, (fence, doc) in enumerate(pending)
        if last.get(doc["_id"]) != i
    ]
    ops += [DeleteOne(pending[i][0]) for i in last.values()]
    ops += [DeleteOne({"_id": task_id}) for task_id in doomed if task_id not in last]
    result = await db.tasks.bulk_write(ops, ordered=True, session=s)
    if result.matched_count + result.deleted_count != len(ops):
        raise Raced
    await db.tombstones.bulk_write(
        [
            ReplaceOne({"_id": task_id}, tombstone(doc, now), upsert=True)
            for task_id, doc in doomed.items()
        ],
        ordered=False,
        session=s,
    )
    # Aliases never ran, and a task that was still unlogged has no rows either.
    unlogged = writes.unlogged
    ran = [
        task_id
        for task_id, doc in doomed.items()
        if doc["alias_of"] is None and task_id not in unlogged
    ]
    if not ran:
        return []
    if len(ran) > 1 and _running().options.serialize_writes:
        # The stand-in searches the log index only for an explicit $eq (a $in on any
        # field but _id scans the collection): one delete per task, in one round trip.
        return [{"task_id": {"$eq": task_id}} for task_id in ran]
    return [{"task_id": {"$in": ran} if len(ran) > 1 else {"$eq": ran[0]}}]


async def _reserve_events(db: AsyncDatabase[Doc], s: AsyncClientSession, count: int) -> EventKey:
    """Take ``count`` consecutive positions of an event shard picked at random, raising
    its ``stamp`` to this transaction's (:func:`_stamp`); the key of the first.

    The events take the shard's stamp after the raise: never below the stamp of the
    shard's earlier events, and below the commit time of this transaction."""
    shard = random.randrange(EVENT_SHARDS)
    doc = await db.counters.find_one_and_update(
        {"_id": SHARDS[shard]},
        {"$inc": {"value": count}, "$max": {"stamp": _stamp(s)}},
        upsert=True,
        return_document=ReturnDocument.AFTER,
        session=s,
    )
    assert doc is not None
    return EventKey(_stamp_value(doc["stamp"]), shard, int(doc["value"]) - count + 1)


def _stamp(s: AsyncClientSession) -> Timestamp | int:
    """This transaction's stamp: the cluster time of its operations so far (the
    largest ``operationTime`` the server answered; at least the time of its first,
    and below its commit), or with ``serialize_writes`` the writer lock's turn.

    Stored as the BSON timestamp it is (unsigned: an int64 of its 64 bits would
    overflow in 2038), read as :func:`_stamp_value`.

    :raises StorageUnavailable: the server reported no cluster time.
    """
    conn = _running()
    if conn.options.serialize_writes:
        return conn.writer_lock.turn
    seen = s.operation_time
    if seen is None:
        raise StorageUnavailable(
            f"MongoDB at {redact(conn.url)} reported no cluster time (operationTime) in "
            "a transaction; taskmill-mongo needs a replica set member or mongos"
        )
    return seen


def _running() -> Connection:
    """The store whose transaction is running (:func:`transaction` sets it)."""
    try:
        return _RUNNING.get()
    except LookupError:
        raise RuntimeError("writes are recorded only inside transaction()") from None


def _stamp_value(stored: Timestamp | int | None) -> int:
    """A shard's stored ``stamp`` as the number it orders by (0 where none is stored)."""
    if isinstance(stored, Timestamp):
        return (stored.time << 32) | stored.inc
    return int(stored or 0)


async def read_log(
    conn: Connection, after: EventKey | None, limit: int
) -> tuple[list[Doc], EventKey]:
    """The event documents after ``after`` in key order (at most ``limit``, positive),
    and the key to read after next time: the last one's, or ``after`` when there is
    none. With ``after`` None, no documents and the key of the newest event committed.

    Every key returned is *closed*: no event commits later below it. Each shard's
    document holds the key of its newest event (its stamp and position); any event
    its document does not show yet has a greater key. Before reading up to the newest
    of those keys, every other shard's document is written (:func:`_close`). Run under
    :func:`read`.
    """
    db = conn.database()
    tips = await _shard_tips(db)
    newest = max(tips)
    if after is not None and newest <= after:
        return [], after
    if conn.events_closed is None or newest > conn.events_closed:
        await _close(db, [name for name, tip in zip(SHARDS, tips, strict=True) if tip != newest])
        conn.events_closed = newest
    if after is None:
        return [], newest
    rows: list[Doc] = []
    if not after.stamped:  # the log numbered before events were stamped
        positions: Doc = {"$gt": after.position}
        if not newest.stamped:
            positions["$lte"] = newest.position
        rows = await db.events.find({"_id": positions}).sort("_id", 1).limit(limit).to_list()
    if newest.stamped and len(rows) < limit:
        lowest = after if after.stamped else _OLDEST_STAMPED
        keys = {"$gt": lowest.token(), "$lte": newest.token()}
        rows += (
            await db.events.find({"_id": keys}).sort("_id", 1).limit(limit - len(rows)).to_list()
        )
    return rows, EventKey.from_document_id(rows[-1]["_id"]) if rows else after


async def _shard_tips(db: AsyncDatabase[Doc]) -> list[EventKey]:
    """The key of each shard's newest event, from its counter document, by shard
    (unstamped, ``(0, 0, position)``, for shard 0's events from before the stamps and
    for a shard without events)."""
    found = {d["_id"]: d async for d in db.counters.find({"_id": {"$in": list(SHARDS)}})}
    if len(found) < len(SHARDS):  # a database of an older release: once, by a first reader
        await create_counters(db, SHARDS)
    tips: list[EventKey] = []
    for shard, name in enumerate(SHARDS):
        doc = found.get(name, {})
        stamp = _stamp_value(doc.get("stamp"))
        tips.append(EventKey(stamp, shard if stamp else 0, int(doc.get("value", 0))))
    return tips


async def _close(db: AsyncDatabase[Doc], shards: list[str]) -> None:
    """Write the counter documents of ``shards`` once, outside any transaction.

    A transaction that holds one of them (it took positions, uncommitted) makes the
    write wait until it ends; one that has not taken positions yet but started before
    conflicts when it does, and runs again with a later stamp. So once this returns,
    every event those shards will show later has a stamp above the newest key read
    before: a transaction that starts now answers a later cluster time (with
    ``serialize_writes``: a later turn)."""
    if shards:
        await db.counters.update_many({"_id": {"$in": shards}}, {"$inc": {"closed": 1}})


async def flush(db: AsyncDatabase[Doc], s: AsyncClientSession, writes: Writes) -> None:
    """Send the replacements ``writes`` holds back, in order, as one ``bulk_write``
    (one round trip); one whose fence matched nothing is a lost race (:class:`Raced`:
    the transaction runs again), as for a replacement written at once."""
    pending = writes.replacements
    if not pending:
        return
    sent = len(pending)
    writes.replacements = []
    result = await db.tasks.bulk_write(
        [ReplaceOne(fence, doc) for fence, doc in pending], ordered=True, session=s
    )
    if result.matched_count != sent:
        raise Raced


async def replace(
    db: AsyncDatabase[Doc],
    s: AsyncClientSession,
    old: Doc,
    new: Task,
    writes: Writes | None = None,
) -> Doc:
    """Write ``new`` over ``old``, fenced by the state ``old`` was read in; return
    the document written. With ``writes`` that batches (``replacements`` a list), the
    write is held back until :func:`flush`.

    The dependency fields carry over: ``waiting_on`` always (a cancelled dependent
    redriven still waits for what has not ended), ``dependents`` while ``new`` is
    active (a task that ends has its dependents settled by the caller, in this
    transaction, which deletes their edges: see
    :func:`~taskmill_mongo.settlement.resolve`)."""
    doc = task_document(new, old["seq"])
    if old.get(WAITING):
        doc[WAITING] = old[WAITING]
    if old.get(DEPENDENTS) and new.status.active:
        doc[DEPENDENTS] = old[DEPENDENTS]
    fence = {
        "_id": old["_id"],
        "status": old["status"],
        "attempts": old["attempts"],
        "worker_id": old["worker_id"],
    }
    if writes is not None and writes.replacements is not None:
        writes.replacements.append((fence, doc))
        return doc
    result = await db.tasks.replace_one(fence, doc, session=s)
    if result.matched_count != 1:
        raise Raced
    return doc
