"""Running an operation: every change is one multi-document transaction, and what a
transaction writes besides the task it decides on.

:func:`transaction` runs a body with the driver's retry rules: a
``TransientTransactionError`` reruns the whole transaction and an
``UnknownTransactionCommitResult`` retries the commit
(``AsyncClientSession.with_transaction``). Each changed task document is written back
fenced by the (status, attempts, worker id) it was read in (:func:`replace`): on a real
replica set a concurrent writer of the same document makes one of the two transactions
abort with a write conflict (transient, so it runs again on the new state), and the
fence makes a lost race visible on any server (:class:`Raced`: the body runs again).

**Event cursors**: each transaction that records events increments the ``events``
counter document by their number and takes those positions (:func:`record`). Two such
transactions write the same document, so they commit one after the other: positions
follow commit order.

With ``serialize_writes`` every transaction and every read runs under the
:mod:`~taskmill_mongo.writer_lock`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, TypeVar

import attrs
from pymongo import ReplaceOne, ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure
from taskmill.errors import StorageUnavailable
from taskmill.model import Attempt, EventKind, Task, TaskStatus

from taskmill_mongo.connection import Connection
from taskmill_mongo.documents import micros, task_document
from taskmill_mongo.options import redact
from taskmill_mongo.schema import DEPENDENTS, WAITING, Doc

__all__ = [
    "Nothing",
    "Raced",
    "Writes",
    "check_transactions",
    "flush",
    "read",
    "record",
    "replace",
    "reserve",
    "transaction",
]

T = TypeVar("T")

_RACE_RETRIES: Final = 20


class Nothing(Exception):
    """A transaction found nothing to write: it ends (aborted, as it wrote nothing)
    with this value."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


class Raced(Exception):
    """A fenced write matched nothing: the transaction runs again on fresh reads."""


async def transaction(conn: Connection, body: Callable[[AsyncClientSession], Awaitable[T]]) -> T:
    """Run ``body`` in a transaction with the driver's retries; a fenced write that
    lost a race (or a dedupe leader inserted meanwhile) runs it again.

    :raises StorageUnavailable: the server is unreachable, or the body lost a race
        ``_RACE_RETRIES`` times in a row.
    :raises InvalidParams: a document written was over the server's largest size.
    """
    db = conn.database()
    client = db.client

    async def opened(s: AsyncClientSession) -> T:
        # The transaction's first command is a write: nx-27017 (the test stand-in)
        # starts a transaction only on a write. On MongoDB it changes nothing.
        await db.counters.update_one({"_id": "events"}, {"$inc": {"value": 0}}, session=s)
        return await body(s)

    async def run() -> T:
        if not conn.options.serialize_writes:
            return await attempts()
        token = await conn.writer_lock.acquire(db)
        try:
            return await attempts()
        finally:
            await asyncio.shield(conn.writer_lock.release(db, token))

    async def attempts() -> T:
        for _ in range(_RACE_RETRIES):
            async with client.start_session() as session:
                try:
                    return await session.with_transaction(opened)
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


async def read(conn: Connection, work: Coroutine[Any, Any, T]) -> T:
    """Run a read; with ``serialize_writes`` under the writer lock, since such a
    server shows other clients' uncommitted writes."""
    if not conn.options.serialize_writes:
        return await conn.guard(work)
    db = conn.database()

    async def locked() -> T:
        token = await conn.writer_lock.acquire(db)
        try:
            return await work
        finally:
            await asyncio.shield(conn.writer_lock.release(db, token))

    try:
        return await conn.guard(locked())
    finally:
        work.close()


async def check_transactions(conn: Connection, db: AsyncDatabase[Doc]) -> None:
    """Refuse a server that cannot run multi-document transactions (a standalone
    mongod): probed with one, so any server that runs them is served.

    :raises StorageUnavailable: saying how to run the server as a replica set.
    """
    try:

        async def probe(session: AsyncClientSession) -> None:
            await db.counters.update_one(
                {"_id": "events"},
                {"$setOnInsert": {"value": 0}},
                upsert=True,
                session=session,
            )

        token = await conn.writer_lock.acquire(db) if conn.options.serialize_writes else None
        try:
            async with db.client.start_session() as session:
                await session.with_transaction(probe)
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


@attrs.define
class Writes:
    """What one transaction writes besides task documents: events and log rows."""

    events: list[tuple[EventKind, str, TaskStatus]] = attrs.field(factory=list)
    attempts: list[Attempt] = attrs.field(factory=list)
    settled_aliases: list[Task] = attrs.field(factory=list)
    """Aliases settled by their terminal leader, in the order written."""
    dependents_cancelled: list[Task] = attrs.field(factory=list)
    """Dependents cancelled because a dependency did not complete, in order."""
    replacements: list[ReplaceOne[Doc]] | None = None
    """When a list, the fenced task replacements not sent yet: the transaction sends
    them as one ``bulk_write`` (:func:`flush`) before it next reads task documents and
    before it records; None: each is written at once."""

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
    """Send what ``writes`` holds back, then append its events (at positions taken
    from the ``events`` counter) and its attempt log rows."""
    await flush(db, s, writes)
    if writes.events:
        first = await reserve(db, s, "events", len(writes.events))
        await db.events.insert_many(
            [
                {
                    "_id": first + i,
                    "kind": k.value,
                    "task_id": tid,
                    "status": st.value,
                    "at": now,
                }
                for i, (k, tid, st) in enumerate(writes.events)
            ],
            session=s,
        )
    if writes.attempts:
        await db.attempts.insert_many(
            [
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
            ],
            session=s,
        )


async def flush(db: AsyncDatabase[Doc], s: AsyncClientSession, writes: Writes) -> None:
    """Send the replacements ``writes`` holds back, in order, as one ``bulk_write``
    (one round trip); one whose fence matched nothing is a lost race (:class:`Raced`:
    the transaction runs again), as for a replacement written at once."""
    pending = writes.replacements
    if not pending:
        return
    sent = len(pending)
    writes.replacements = []
    result = await db.tasks.bulk_write(pending, ordered=True, session=s)
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
        writes.replacements.append(ReplaceOne(fence, doc))
        return doc
    result = await db.tasks.replace_one(fence, doc, session=s)
    if result.matched_count != 1:
        raise Raced
    return doc
