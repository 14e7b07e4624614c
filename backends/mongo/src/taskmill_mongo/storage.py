"""``mongodb://`` — taskmill on MongoDB through PyMongo's async API.

Every operation that changes state is one multi-document transaction
(:meth:`MongoStorage._transaction`), run with the driver's retry rules: a
``TransientTransactionError`` reruns the whole transaction and an
``UnknownTransactionCommitResult`` retries the commit
(``AsyncClientSession.with_transaction``). Inside it the operation reads the task
documents it needs, decides with the lifecycle kernel (:mod:`taskmill.lifecycle`) exactly
as the memory store does, and writes each changed document back fenced by the
(status, attempts, worker id) it read: on a real replica set a concurrent writer of the
same document makes one of the two transactions abort with a write conflict (transient,
so it runs again on the new state), and the fence makes a lost race visible on any server.

- **Claims** read candidate documents in claim order (priority DESC, insertion ASC) from
  the claim index, pick them in Python with the host/app handler rule, the caps and the
  suspensions, then stamp the picked ones RUNNING with one ``update_many`` and read them
  back by its claim token.
- **Dedupe**: ``leader_key`` is set only while a task is an active leader, and a unique
  partial index on it admits one leader per key; an enqueue that loses that race (a
  duplicate-key error) runs again and then finds the leader.
- **Dependencies** (``after=``): one ``dependencies`` document per unresolved edge; the
  dependent carries ``waiting_on`` (claims take only tasks without it) and each
  dependency ``dependents``, which the enqueue of a dependent ``$inc``s so that it
  write-conflicts with the dependency's end. Every terminal transition goes through
  :meth:`MongoStorage._settle`, which settles the dependents in the same transaction
  with the lifecycle kernel's rules (:meth:`MongoStorage._resolve`).
- **Global limits**: a claim first writes the ``buckets`` document of each limited key
  (so two claims of one key conflict, as a row lock would serialize them), then reads
  its tokens, counts the key's RUNNING tasks and cuts its caps
  (:func:`taskmill.limits.limited_caps`), all inside the claim's transaction.
- **Event cursors**: each transaction that records events increments the ``events``
  counter document by their number and takes those positions. Two such transactions
  write the same document, so they commit one after the other: positions follow commit
  order.
- **The clock** is the server's: ``hello``'s ``localTime`` gives the offset of the
  server clock from this process's, measured at ``open`` and every minute after (the
  round trip's midpoint), and every timestamp written is this clock plus the offset.
- **Document size**: the same ``hello`` at ``open`` gives ``maxBsonObjectSize``, from
  which the store's ``max_value_bytes`` is set
  (:func:`~taskmill_mongo.documents.value_ceiling`); a write the driver or the server
  still refuses as too large is :class:`~taskmill.errors.InvalidParams`.

Why one long module: it is the storage class, one domain operation per method over the
same transaction helper and document layout; split, each half would need the other's
private helpers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar, Final, Self, TypeVar

import attrs
from pymongo import (
    ASCENDING,
    DESCENDING,
    AsyncMongoClient,
    IndexModel,
    ReplaceOne,
    ReturnDocument,
)
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.common import MAX_BSON_SIZE
from pymongo.errors import (
    BulkWriteError,
    CollectionInvalid,
    DocumentTooLarge,
    DuplicateKeyError,
    OperationFailure,
    PyMongoError,
)
from taskmill.cursors import position_token, token_position
from taskmill.errors import (
    InvalidParams,
    SchemaVersionError,
    StorageUnavailable,
    TaskmillError,
    TaskNotFound,
)
from taskmill.filters import Op, conditions
from taskmill.lifecycle import (
    CANCELLATION,
    DEFAULT_CANCEL_REASON,
    DEPENDENCY_CANCEL_REASON,
    DEPENDENCY_CANCELLATION,
    FINISHES,
    REDRIVE_EVENT,
    RESCUE_ERROR,
    RESCUES,
    TERMINAL_EVENTS,
    DependentOutcome,
    TransitionPlan,
    cancel_error,
    cancel_targets,
    check_redrive,
    dependency_blocks,
    dependency_error,
    dependency_settles,
    enqueued,
    finish_kind,
    key_taken,
    plan,
    rescue_case,
    settle_alias,
    settles_aliases,
    split_taken,
    unknown_dependency,
)
from taskmill.limits import Bucket, limited_caps, locked_keys, refill, scope_of, spend, taken_by_key
from taskmill.model import (
    NO_PROGRESS,
    Attempt,
    AttemptOutcome,
    CancelReason,
    EventKind,
    ProgressSummary,
    SuspensionScope,
    Task,
    TaskEvent,
    TaskFilter,
    TaskStatus,
)
from taskmill.serialization import dumps, loads
from taskmill.storage import (
    ChangeListener,
    ClaimRequest,
    Finish,
    FinishKind,
    HandlerKey,
    HandlerRegistration,
    Lease,
    NewTask,
    ProgressUpdate,
    StorageCapabilities,
    TaskStorage,
    wall_clock,
)

from taskmill_mongo.documents import (
    from_micros,
    leader_key,
    micros,
    task,
    task_document,
    value_ceiling,
)
from taskmill_mongo.listener import MongoChangeListener
from taskmill_mongo.options import MongoOptions, parse_url, redact

__all__ = ["SCHEMA_VERSION", "MongoStorage"]

T = TypeVar("T")
Doc = dict[str, Any]

SCHEMA_VERSION: Final = 2
"""The version of the collections and indexes this code creates (``taskmill_meta``).

1. ``tasks``, ``attempts``, ``events``, ``counters``, ``suspensions``, ``handlers``.
2. Task dependencies (collection ``dependencies``; the task fields ``waiting_on`` and
   ``dependents``, absent when 0) and global limits (collection ``buckets``). Version 1
   data needs no rewrite: a task without the new fields waits for nothing and has no
   dependents, so ``migrate`` only creates the new indexes.
"""

_PENDING: Final = TaskStatus.PENDING.value
_RUNNING: Final = TaskStatus.RUNNING.value
_ACTIVE: Final = [_PENDING, _RUNNING]
assert CANCELLATION.outcome is not None
_CANCELLED_OUTCOME: Final = CANCELLATION.outcome
_FINISH_PLANS: Final = {kind: plan(t) for kind, t in FINISHES.items()}
_RESCUE_PLANS: Final = {case: plan(t) for case, t in RESCUES.items()}
_CANCEL_PLAN: Final = plan(CANCELLATION)
_DEPENDENCY_CANCEL_PLAN: Final = plan(DEPENDENCY_CANCELLATION)
_CLOCK_REFRESH: Final = 60.0
_RACE_RETRIES: Final = 20
_LOCK_SECONDS: Final = 3.0
# How long the writer lock lasts without a renewal: its holder renews it every
# _LOCK_RENEW seconds while it holds it, so a holder that died (kill -9) holds the
# others up for at most this long (it was a fixed 30 s before).
_LOCK_RENEW: Final = 0.5
_LOCK_WAIT: Final = 30.0
_HOLDER: Final = f"{socket.gethostname()}:{os.getpid()}"
# How long (beyond connect_timeout) a store waits for the writer lock before giving up.
# How long a waiter's claim to be the writer lock's next owner lasts without a renewal
# (it renews on every poll, at most every 20 ms).
_NEXT_SECONDS: Final = 2.0
_COLLECTIONS: Final = (
    "tasks",
    "attempts",
    "events",
    "counters",
    "suspensions",
    "handlers",
    "dependencies",
    "buckets",
)
# The task fields a task document carries besides what task_document() writes (both
# absent when 0, so that a version-1 document reads as waiting for nothing):
# how many of its dependencies have not ended yet (a PENDING task with it is not
# claimable), and how many dependency edges name it (a hint that its end has dependents
# to settle, and the field an enqueue of a dependent writes to conflict with its end).
_WAITING: Final = "waiting_on"
_DEPENDENTS: Final = "dependents"
_TOO_LARGE: Final = frozenset({10334, 17419, 17420})
"""Server errors for a document over ``maxBsonObjectSize``: BSONObjectTooLarge, and
(older servers) an update's or an upsert's resulting document too large. An insert just
over it is refused with BadValue (2), "object to insert too large"."""


def _too_large(exc: PyMongoError) -> bool:
    """Whether the server refused a write because a document would be too large."""
    if isinstance(exc, BulkWriteError):
        errors = exc.details.get("writeErrors", [])
        return any(_too_large_error(e.get("code"), str(e.get("errmsg", ""))) for e in errors)
    return isinstance(exc, OperationFailure) and _too_large_error(exc.code, str(exc))


def _too_large_error(code: int | None, message: str) -> bool:
    return code in _TOO_LARGE or (code == 2 and "too large" in message)


TASK_INDEXES: Final = [
    IndexModel([("seq", ASCENDING)], name="seq", unique=True),
    # Claims: PENDING leaders of some types, in claim order (aliases are filtered out).
    IndexModel(
        [("status", ASCENDING), ("task_type", ASCENDING), ("priority", DESCENDING), ("seq", 1)],
        name="claim",
    ),
    IndexModel(
        [("leader_key", ASCENDING)],
        name="leader_key",
        unique=True,
        partialFilterExpression={"leader_key": {"$type": "string"}},
    ),
    IndexModel([("status", ASCENDING), ("lease_expires_at", ASCENDING)], name="lease"),
    IndexModel([("status", ASCENDING), ("finished_at", ASCENDING)], name="retention"),
    IndexModel([("parent_id", ASCENDING), ("seq", ASCENDING)], name="children"),
    IndexModel([("alias_of", ASCENDING), ("seq", ASCENDING)], name="aliases"),
    IndexModel([("claim_token", ASCENDING)], name="claim_token", sparse=True),
]
ATTEMPT_INDEXES: Final = [
    IndexModel([("task_id", ASCENDING), ("number", ASCENDING), ("seq", ASCENDING)], name="log"),
]
EVENT_INDEXES: Final = [IndexModel([("at", ASCENDING)], name="at")]
# One document per unresolved dependency edge: ``task_id`` waits for ``depends_on``.
DEPENDENCY_INDEXES: Final = [
    IndexModel([("depends_on", ASCENDING), ("task_id", ASCENDING)], name="depends_on"),
    IndexModel([("task_id", ASCENDING)], name="dependent"),
]


async def _change_streams_offered(db: AsyncDatabase[Doc]) -> bool:
    """Whether the server opens a change stream (``notifications``): a standalone
    mongod, a user without the ``changeStream`` action, or a server that does not know
    ``$changeStream`` refuse it. Probed on ``taskmill_meta``, which is rarely written
    (on nx-27017 a watched collection gets write triggers)."""
    try:
        stream = await db.taskmill_meta.watch([], max_await_time_ms=1)
    except OperationFailure:
        return False
    await stream.close()
    return True


class _Nothing(Exception):
    """A transaction found nothing to write: it ends (aborted, as it wrote nothing)
    with this value."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


class _Raced(Exception):
    """A fenced write matched nothing: the transaction runs again on fresh reads."""


def _eq(value: Any) -> Doc:
    """``{field: value}`` as ``{field: {"$eq": value}}``: the same query on MongoDB
    (the short form is defined as ``$eq``), but nx-27017 (the test stand-in) can search
    an index only for the explicit form; for the short one it scans the collection."""
    return {"$eq": value}


def _one_of(values: Sequence[Any]) -> Doc:
    """``$in``, or ``$eq`` for one value (which the stand-in searches an index for)."""
    return _eq(values[0]) if len(values) == 1 else {"$in": list(values)}


def _scope_id(scope: SuspensionScope) -> str:
    return dumps([scope.app_id, scope.task_type])


def _filter_query(f: TaskFilter) -> Doc:
    """``f`` as a query on task documents (the conditions of :mod:`taskmill.filters`)."""
    query: Doc = {}
    clauses: list[Doc] = []
    for c in conditions(f):
        field = "_id" if c.field == "id" else c.field
        value = c.value
        if c.op is Op.CONTAINS:
            import re

            pattern = re.escape(str(value))
            names = ["_id" if n == "id" else n for n in c.fields]
            clauses.append({"$or": [{n: {"$regex": pattern}} for n in names]})
        elif c.op is Op.EQUALS:
            clauses.append({field: _stored(value)})
        elif c.op is Op.ONE_OF:
            clauses.append({field: {"$in": [_stored(v) for v in value]}})
        elif c.op is Op.AFTER:
            clauses.append({field: {"$gt": _stored(value)}})
        else:
            clauses.append({field: {"$lt": _stored(value)}})
    if clauses:
        query["$and"] = clauses
    return query


def _stored(value: Any) -> Any:
    if isinstance(value, datetime):
        return micros(value)
    if isinstance(value, TaskStatus | CancelReason):
        return value.value
    return value


@attrs.define
class _Writes:
    """What one transaction writes besides task documents: events and log rows."""

    events: list[tuple[EventKind, str, TaskStatus]] = attrs.field(factory=list)
    attempts: list[Attempt] = attrs.field(factory=list)
    settled_aliases: list[Task] = attrs.field(factory=list)
    """Aliases settled by their terminal leader, in the order written."""
    dependents_cancelled: list[Task] = attrs.field(factory=list)
    """Dependents cancelled because a dependency did not complete, in order."""
    replacements: list[ReplaceOne[Doc]] | None = None
    """When a list, the fenced task replacements not sent yet: the transaction sends
    them as one ``bulk_write`` (:meth:`MongoStorage._flush`) before it next reads task
    documents and before it records; None: each is written at once."""

    def emit(self, kind: EventKind, t: Task) -> None:
        self.events.append((kind, t.id, t.status))


class MongoStorage(TaskStorage):
    """Storage on a MongoDB replica set (or mongos). See the module docstring."""

    capabilities: ClassVar[StorageCapabilities] = StorageCapabilities(
        durable=True,
        shared_between_processes=True,
        # Where the server offers change streams: open() probes, and a store on a server
        # that refuses them declares notifications=False on the instance (it polls).
        notifications=True,
        transactions_across_records=True,
        commit_ordered_cursors=True,
        dependencies=True,
        global_limits=True,
        handler_registrations=True,
    )

    def __init__(self, options: MongoOptions) -> None:
        self.url = options.url
        self.options = options
        self.database = options.database
        self._client: AsyncMongoClient[Doc] | None = None
        self._db: AsyncDatabase[Doc] | None = None
        self._offset = 0.0
        self._clock_at = 0.0
        self._max_document = MAX_BSON_SIZE
        self._lock_ready = False
        # serialize_writes: the coroutines of this store queue here, so that only one of
        # them at a time polls the writer lock document (polls cost the server).
        self._local_lock: asyncio.Lock | None = None
        self._local_loop: asyncio.AbstractEventLoop | None = None
        self._renewers: dict[str, asyncio.Task[None]] = {}

    def __repr__(self) -> str:
        return f"MongoStorage({redact(self.url)!r})"

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        return cls(parse_url(url, options))

    # -- connection, errors, clock ---------------------------------------------------

    def _new_client(self) -> AsyncMongoClient[Doc]:
        ms = int(self.options.connect_timeout * 1000)
        return AsyncMongoClient(
            self.options.driver_url,
            serverSelectionTimeoutMS=ms,
            connectTimeoutMS=ms,
            appname="taskmill",
            tz_aware=True,
        )

    def _unavailable(self, exc: PyMongoError) -> StorageUnavailable:
        message = str(exc).replace(self.url, redact(self.url))
        return StorageUnavailable(
            f"MongoDB at {redact(self.url)} is unavailable: {message}; check that the "
            "server (a replica set member or mongos) is running and reachable"
        )

    def _document_too_large(self, exc: Exception) -> InvalidParams:
        message = str(exc).replace(self.url, redact(self.url)).rstrip(".")
        return InvalidParams(
            f"MongoDB at {redact(self.url)} refused a document over its largest document "
            f"size (maxBsonObjectSize, {self._max_document} bytes): {message}. A value "
            "written is too large: keep params and results within the store's "
            f"max_value_bytes ({value_ceiling(self._max_document)} bytes) and a task's "
            "data well below it, storing large values elsewhere and passing a reference",
            field=None,
        )

    async def _guard(self, work: Awaitable[T]) -> T:
        """Run ``work`` with the driver's errors mapped: a document over the server's
        size limit is :class:`~taskmill.errors.InvalidParams` (nothing was written),
        anything else :class:`~taskmill.errors.StorageUnavailable`; the driver's error
        is the cause."""
        try:
            return await work
        except TaskmillError:
            raise
        except DocumentTooLarge as exc:  # refused by the driver, before sending
            raise self._document_too_large(exc) from exc
        except PyMongoError as exc:
            if _too_large(exc):
                raise self._document_too_large(exc) from exc
            raise self._unavailable(exc) from exc

    async def _read(self, work: Coroutine[Any, Any, T]) -> T:
        """Run a read; with ``serialize_writes`` under the writer lock, since such a
        server shows other clients' uncommitted writes."""
        if not self.options.serialize_writes:
            return await self._guard(work)
        db = self._database()

        async def locked() -> T:
            token = await self._lock(db)
            try:
                return await work
            finally:
                await asyncio.shield(self._unlock(db, token))

        try:
            return await self._guard(locked())
        finally:
            work.close()

    def _database(self) -> AsyncDatabase[Doc]:
        if self._db is None:
            raise StorageUnavailable(
                f"this store ({redact(self.url)}) is not open; call open() first"
            )
        return self._db

    async def _sync_clock(self, db: AsyncDatabase[Doc]) -> Doc:
        """Measure the server clock's offset; the ``hello`` response it was read from."""
        before = wall_clock()
        hello = await db.client.admin.command("hello")
        after = wall_clock()
        server: datetime | None = hello.get("localTime")
        if server is not None:
            self._offset = server.timestamp() - (before + after) / 2
        self._clock_at = time.monotonic()
        return hello

    async def _now(self) -> int:
        """The server's clock, in microseconds since the epoch."""
        if time.monotonic() - self._clock_at > _CLOCK_REFRESH and self._db is not None:
            await self._sync_clock(self._db)
        return int((wall_clock() + self._offset) * 1_000_000)

    async def _transaction(self, body: Callable[[AsyncClientSession], Awaitable[T]]) -> T:
        """Run ``body`` in a transaction with the driver's retries; a fenced write that
        lost a race (or a dedupe leader inserted meanwhile) runs it again."""
        db = self._database()
        client = db.client

        async def opened(s: AsyncClientSession) -> T:
            # The transaction's first command is a write: nx-27017 (the test stand-in)
            # starts a transaction only on a write. On MongoDB it changes nothing.
            await db.counters.update_one({"_id": "events"}, {"$inc": {"value": 0}}, session=s)
            return await body(s)

        async def run() -> T:
            if not self.options.serialize_writes:
                return await attempts()
            token = await self._lock(db)
            try:
                return await attempts()
            finally:
                await asyncio.shield(self._unlock(db, token))

        async def attempts() -> T:
            for _ in range(_RACE_RETRIES):
                async with client.start_session() as session:
                    try:
                        return await session.with_transaction(opened)
                    except _Nothing as nothing:
                        return nothing.value  # type: ignore[no-any-return]
                    except (_Raced, DuplicateKeyError):
                        await asyncio.sleep(0.005)
                    except BulkWriteError as exc:
                        errors = exc.details.get("writeErrors", [])
                        if not errors or any(e.get("code") != 11000 for e in errors):
                            raise
                        await asyncio.sleep(0.005)  # a dedupe leader inserted meanwhile
            raise StorageUnavailable(
                f"MongoDB at {redact(self.url)}: a transaction lost {_RACE_RETRIES} races "
                "in a row to concurrent writers; try again"
            )

        return await self._guard(run())

    async def _unlock(self, db: AsyncDatabase[Doc], token: str) -> None:
        """Free the writer lock if ``token`` still holds it (shielded by callers, so a
        cancelled operation still frees it), stop renewing it, and let this store's next
        coroutine take it."""
        renewer = self._renewers.pop(token, None)
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(BaseException):
                await renewer
        try:
            await db.counters.update_one(
                {"_id": "writer", "owner": token}, {"$set": {"owner": None}}
            )
        finally:
            # Unreachable server: the lock lapses by itself within _LOCK_SECONDS.
            if self._local_lock is not None and self._local_lock.locked():
                self._local_lock.release()

    async def _renew(self, db: AsyncDatabase[Doc], token: str) -> None:
        """Keep the writer lock ``token`` holds alive until :meth:`_unlock` stops it."""
        while True:
            await asyncio.sleep(_LOCK_RENEW)
            try:
                now = await self._now()
                renewed = await db.counters.update_one(
                    {"_id": "writer", "owner": token},
                    {"$set": {"until": now + int(_LOCK_SECONDS * 1e6)}},
                )
            except PyMongoError:
                continue  # the server is away: the operation holding the lock fails too
            if renewed.matched_count == 0:
                return  # lost (the server lost it in a restart, say): nothing to keep

    async def _lock(self, db: AsyncDatabase[Doc]) -> str:
        """Take the writer lock (``serialize_writes``): a lock document with an owner
        and an expiry ``_LOCK_SECONDS`` ahead that the holder renews while it holds the
        lock, so that a holder that died frees it within ``_LOCK_SECONDS``.

        The coroutines of one store take turns on an in-process lock first, so that
        each process has one poller at most. The lock is handed over fairly between
        processes: a waiter that finds it taken registers as the next owner (``next``,
        kept alive while it polls), and nobody else may take the free lock before it.
        Without that, a store that locks in a tight loop (a poller, say) retakes the
        lock in the instant after each release, and a waiter polling every few
        milliseconds starves until its deadline."""
        loop = asyncio.get_running_loop()
        if self._local_lock is None or self._local_loop is not loop:
            self._local_lock, self._local_loop = asyncio.Lock(), loop
        deadline = time.monotonic() + self.options.connect_timeout + _LOCK_WAIT
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can time out a lock
            # it has just acquired, which would then never be released.
            async with asyncio.timeout(_LOCK_WAIT):
                await self._local_lock.acquire()
        except TimeoutError:
            raise StorageUnavailable(
                f"MongoDB at {redact(self.url)}: the writer lock (serialize_writes) "
                "stayed taken; try again"
            ) from None
        try:
            token = await self._take(db, deadline)
        except BaseException:
            self._local_lock.release()
            raise
        self._renewers[token] = asyncio.create_task(self._renew(db, token))
        return token

    async def _take(self, db: AsyncDatabase[Doc], deadline: float) -> str:
        """Take the writer lock document (this store's in-process lock held)."""
        token = uuid.uuid4().hex
        delay = 0.001
        if not self._lock_ready:
            with contextlib.suppress(DuplicateKeyError):  # created by another process
                if await db.counters.find_one({"_id": "writer"}, {"_id": 1}) is None:
                    await db.counters.insert_one(
                        {"_id": "writer", "owner": None, "until": 0, "next": None, "next_until": 0}
                    )
            self._lock_ready = True
        while True:
            now = await self._now()
            not_promised = {"$or": [{"next": None}, {"next": token}, {"next_until": {"$lt": now}}]}
            got = await db.counters.find_one_and_update(
                {
                    "_id": "writer",
                    "$and": [
                        {"$or": [{"owner": None}, {"until": {"$lt": now}}]},
                        not_promised,
                    ],
                },
                {
                    "$set": {
                        "owner": token,
                        "until": now + int(_LOCK_SECONDS * 1e6),
                        # Who holds it (for an operator, and the chaos run's harness).
                        "holder": _HOLDER,
                        "next": None,
                        "next_until": 0,
                    }
                },
            )
            if got is not None:
                return token
            if time.monotonic() > deadline:
                raise StorageUnavailable(
                    f"MongoDB at {redact(self.url)}: the writer lock (serialize_writes) "
                    "stayed taken; try again"
                )
            # Queue as the next owner (or stay queued): a promise that lapses when its
            # waiter stops polling, so a waiter that died does not hold others up.
            await db.counters.update_one(
                {"_id": "writer", **not_promised},
                {"$set": {"next": token, "next_until": now + int(_NEXT_SECONDS * 1e6)}},
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)

    # -- lifecycle -------------------------------------------------------------------

    async def exists(self) -> bool:
        client = self._new_client()
        try:
            names = await self._guard(client[self.database].list_collection_names())
        finally:
            await client.close()
        return "taskmill_meta" in names

    async def open(self, *, auto_migrate: bool = False) -> None:
        if self._db is not None:
            return
        client = self._new_client()
        db = client[self.database]
        try:
            version = await self._guard(self._stored_version(db))
            await self._guard(self._check_server(db))
            if version is None or (version < SCHEMA_VERSION and auto_migrate):
                await self._guard(self._create(db))
            else:
                self._check_version(version)
            hello = await self._guard(self._sync_clock(db))
            offered = await self._guard(_change_streams_offered(db))
        except BaseException:
            await client.close()
            raise
        self._max_document = int(hello.get("maxBsonObjectSize", MAX_BSON_SIZE))
        # Per instance, shadowing the class's declaration: the core and the contract
        # suite read ``storage.capabilities`` from the store object.
        vars(self)["capabilities"] = attrs.evolve(
            type(self).capabilities,
            notifications=offered,
            max_value_bytes=value_ceiling(self._max_document),
        )
        self._client, self._db = client, db

    async def close(self) -> None:
        client, self._client, self._db = self._client, None, None
        if client is not None:
            await client.close()

    async def change_listener(self) -> ChangeListener | None:
        """A :class:`~taskmill_mongo.listener.MongoChangeListener` (change streams,
        on a client of its own), or None when the server refused change streams at
        :meth:`open`."""
        self._database()
        if not self.capabilities.notifications:
            return None
        return await MongoChangeListener.open(self._new_client, self.database)

    async def _check_server(self, db: AsyncDatabase[Doc]) -> None:
        """Refuse a server that cannot run multi-document transactions (a standalone
        mongod): probed with one, so any server that runs them is served."""
        try:

            async def probe(session: AsyncClientSession) -> None:
                await db.counters.update_one(
                    {"_id": "events"},
                    {"$setOnInsert": {"value": 0}},
                    upsert=True,
                    session=session,
                )

            token = await self._lock(db) if self.options.serialize_writes else None
            try:
                async with db.client.start_session() as session:
                    await session.with_transaction(probe)
            finally:
                if token is not None:
                    await asyncio.shield(self._unlock(db, token))
        except OperationFailure as exc:
            if exc.code == 20 or "replica set" in str(exc) or "Transaction" in str(exc):
                raise StorageUnavailable(
                    f"the MongoDB server at {redact(self.url)} cannot run multi-document "
                    "transactions, which taskmill needs: it is a standalone server. Run "
                    "it as a replica set (a single member will do: start mongod with "
                    "--replSet rs0 and run rs.initiate()) or connect through mongos"
                ) from exc
            raise

    async def _stored_version(self, db: AsyncDatabase[Doc]) -> int | None:
        meta = await db.taskmill_meta.find_one({"_id": "schema"})
        if meta is None:
            names = set(await db.list_collection_names())
            if names - {"taskmill_meta", *_COLLECTIONS}:
                raise StorageUnavailable(
                    f"database {self.database!r} at {redact(self.url)} is not a taskmill "
                    f"database (it holds {', '.join(sorted(names))}); name an empty or "
                    "a taskmill database in the URL"
                )
            return None
        return int(meta["version"])

    def _check_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"database {self.database!r} has taskmill schema version {version}, newer "
                f"than this taskmill-mongo knows ({SCHEMA_VERSION}); upgrade it: "
                "pip install --upgrade taskmill-mongo"
            )
        if version < SCHEMA_VERSION:
            raise SchemaVersionError(
                f"database {self.database!r} has taskmill schema version {version}, older "
                f"than this code needs ({SCHEMA_VERSION}); run: "
                f"taskmill migrate --url {redact(self.url)}"
            )

    async def _create(self, db: AsyncDatabase[Doc]) -> None:
        """Create the collections' indexes (idempotent: the same definitions from
        several processes at once are one index) and record the version."""
        await db.tasks.create_indexes(TASK_INDEXES)
        await db.attempts.create_indexes(ATTEMPT_INDEXES)
        await db.events.create_indexes(EVENT_INDEXES)
        await db.dependencies.create_indexes(DEPENDENCY_INDEXES)
        # Every collection is created here, outside any transaction, not by its first
        # write: ``suspensions`` and ``buckets`` are first written inside a
        # transaction (a suspend, a claim's rate-limit upsert), and creating a
        # collection there is refused by MongoDB before 4.4 and in cross-shard write
        # transactions, and raced in the MongoDB-protocol test server (a suspend
        # once failed there with "no such table: suspensions").
        existing = set(await db.list_collection_names())
        for name in _COLLECTIONS:
            if name in existing:
                continue
            with contextlib.suppress(CollectionInvalid):  # created by another process
                try:
                    await db.create_collection(name)
                except OperationFailure as exc:
                    if exc.code != 48:  # NamespaceExists: created meanwhile
                        raise
        for counter in ("tasks", "events"):
            with contextlib.suppress(DuplicateKeyError):  # another process inserted it first
                await db.counters.update_one(
                    {"_id": counter}, {"$setOnInsert": {"value": 0}}, upsert=True
                )
        # DuplicateKeyError: recorded (at this version or newer) by another process meanwhile.
        with contextlib.suppress(DuplicateKeyError):
            await db.taskmill_meta.update_one(
                {"_id": "schema", "version": {"$lt": SCHEMA_VERSION}},
                {"$set": {"version": SCHEMA_VERSION}},
                upsert=True,
            )

    async def migrate(self) -> int:
        client = self._new_client()
        db = client[self.database]
        try:
            version = await self._guard(self._stored_version(db))
            if version is not None and version > SCHEMA_VERSION:
                self._check_version(version)
            await self._guard(self._create(db))
            stored = await self._guard(self._stored_version(db))
            assert stored is not None
            self._check_version(stored)
            return stored
        finally:
            await client.close()

    # -- shared writes ---------------------------------------------------------------

    async def _reserve(self, s: AsyncClientSession, counter: str, count: int) -> int:
        doc = await self._database().counters.find_one_and_update(
            {"_id": counter},
            {"$inc": {"value": count}},
            upsert=True,
            return_document=ReturnDocument.AFTER,
            session=s,
        )
        assert doc is not None
        return int(doc["value"]) - count + 1

    async def _record(self, s: AsyncClientSession, writes: _Writes, now: int) -> None:
        db = self._database()
        await self._flush(s, writes)
        if writes.events:
            first = await self._reserve(s, "events", len(writes.events))
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

    async def _flush(self, s: AsyncClientSession, writes: _Writes) -> None:
        """Send the replacements ``writes`` holds back, in order, as one ``bulk_write``
        (one round trip); one whose fence matched nothing is a lost race (:class:`_Raced`:
        the transaction runs again), as for a replacement written at once."""
        pending = writes.replacements
        if not pending:
            return
        sent = len(pending)
        writes.replacements = []
        result = await self._database().tasks.bulk_write(pending, ordered=True, session=s)
        if result.matched_count != sent:
            raise _Raced

    async def _replace(
        self, s: AsyncClientSession, old: Doc, new: Task, writes: _Writes | None = None
    ) -> Doc:
        """Write ``new`` over ``old``, fenced by the state ``old`` was read in; return
        the document written. With ``writes`` that batches (``replacements`` a list), the
        write is held back until :meth:`_flush`.

        The dependency fields carry over: ``waiting_on`` always (a cancelled dependent
        redriven still waits for what has not ended), ``dependents`` while ``new`` is
        active (a task that ends has its dependents settled by the caller, in this
        transaction, which deletes their edges: see :meth:`_resolve`)."""
        doc = task_document(new, old["seq"])
        if old.get(_WAITING):
            doc[_WAITING] = old[_WAITING]
        if old.get(_DEPENDENTS) and new.status.active:
            doc[_DEPENDENTS] = old[_DEPENDENTS]
        fence = {
            "_id": old["_id"],
            "status": old["status"],
            "attempts": old["attempts"],
            "worker_id": old["worker_id"],
        }
        if writes is not None and writes.replacements is not None:
            writes.replacements.append(ReplaceOne(fence, doc))
            return doc
        result = await self._database().tasks.replace_one(fence, doc, session=s)
        if result.matched_count != 1:
            raise _Raced
        return doc

    async def _settle(
        self,
        s: AsyncClientSession,
        doc: Doc,
        chosen: TransitionPlan,
        now: int,
        writes: _Writes,
        **values: Any,
    ) -> Task:
        """Write a transition of ``doc``'s task and its consequences: the event, and,
        when it reaches a terminal status, the settlement of its aliases (when it is a
        leader) and then of the dependents of it and of those aliases."""
        at = from_micros(now)
        new = chosen.apply(task(doc), at, **values)
        await self._replace(s, doc, new, writes)
        writes.emit(chosen.transition.event, new)
        if not new.status.terminal:
            return new
        ended: list[tuple[str, TaskStatus]] = []
        if doc.get(_DEPENDENTS):
            ended.append((new.id, new.status))
        if settles_aliases(new.status, new.dedupe_key, new.alias_of):
            await self._flush(s, writes)  # the reads below see what this wrote
            kind = TERMINAL_EVENTS[new.status]
            cursor = (
                self._database()
                .tasks.find({"alias_of": _eq(new.id), "status": _eq(_PENDING)}, session=s)
                .sort("seq", ASCENDING)
                .hint("aliases")
            )
            async for alias_doc in cursor:
                alias = settle_alias(task(alias_doc), new, at)
                await self._replace(s, alias_doc, alias, writes)
                writes.emit(kind, alias)
                writes.settled_aliases.append(alias)
                if alias_doc.get(_DEPENDENTS):
                    ended.append((alias.id, alias.status))
        if ended:
            await self._flush(s, writes)
            await self._resolve(s, ended, now, writes)
        return new

    async def _resolve(
        self,
        s: AsyncClientSession,
        ended: list[tuple[str, TaskStatus]],
        now: int,
        writes: _Writes,
    ) -> None:
        """Settle the dependents of the tasks that just ended (id, terminal status) as
        :func:`taskmill.lifecycle.dependency_settles` says, and in turn, breadth first,
        those of the dependents that cancels; each edge is resolved once (deleted)."""
        db = self._database()
        at = from_micros(now)
        level = ended
        while level:
            status_of = dict(level)
            level = []
            edges = await db.dependencies.find(
                {"depends_on": _one_of(list(status_of))}, session=s
            ).to_list()
            if not edges:
                break
            await db.dependencies.delete_many(
                {"_id": {"$in": [e["_id"] for e in edges]}}, session=s
            )
            wanted = sorted({e["task_id"] for e in edges})
            docs = {d["_id"]: d async for d in db.tasks.find({"_id": {"$in": wanted}}, session=s)}
            # In the dependents' creation order (the reference store's), deleted ones last.
            edges.sort(
                key=lambda e: (
                    docs[e["task_id"]]["seq"] if e["task_id"] in docs else -1,
                    e["depends_on"],
                )
            )
            for edge in edges:
                doc = docs.get(edge["task_id"])
                if doc is None:
                    continue  # removed by cleanup
                waiting = int(doc.get(_WAITING) or 0)
                left = max(waiting - 1, 0)
                if waiting:
                    change = {"$set": {_WAITING: left}} if left else {"$unset": {_WAITING: ""}}
                    result = await db.tasks.update_one(
                        {"_id": doc["_id"], _WAITING: waiting}, change, session=s
                    )
                    if result.matched_count != 1:
                        raise _Raced
                    doc = {k: v for k, v in doc.items() if k != _WAITING}
                    if left:
                        doc[_WAITING] = left
                    docs[doc["_id"]] = doc
                ended_as = status_of[edge["depends_on"]]
                blocks = bool(dependency_blocks(ended_as, bool(edge["always"])))
                outcome = dependency_settles(TaskStatus(doc["status"]), left, blocks=blocks)
                if outcome is DependentOutcome.RELEASED:
                    writes.emit(EventKind.RELEASED, task(doc))
                elif outcome is DependentOutcome.CANCELLED:
                    new = _DEPENDENCY_CANCEL_PLAN.apply(
                        task(doc),
                        at,
                        error=dependency_error(edge["depends_on"], ended_as),
                        cancel_reason=DEPENDENCY_CANCEL_REASON,
                    )
                    docs[doc["_id"]] = await self._replace(s, doc, new)
                    writes.emit(DEPENDENCY_CANCELLATION.event, new)
                    writes.dependents_cancelled.append(new)
                    if doc.get(_DEPENDENTS):
                        level.append((new.id, new.status))

    # -- writing tasks ---------------------------------------------------------------

    async def enqueue(self, tasks: Sequence[NewTask]) -> list[Task]:
        if not tasks:
            self._database()
            return []

        async def body(s: AsyncClientSession) -> list[Task]:
            db = self._database()
            now = await self._now()
            at = from_micros(now)
            # The duplicate-id rule (lifecycle.split_taken): ids already stored are
            # returned as they are; an id inserted concurrently makes the insert fail on
            # _id and the transaction run again, finding it here.
            ids = list(dict.fromkeys(new.id for new in tasks))
            taken = {
                doc["_id"]: task(doc)
                async for doc in db.tasks.find({"_id": {"$in": ids}}, session=s)
            }
            fresh, known = split_taken(tasks, taken)
            dependencies = await self._dependencies(s, fresh)
            first = await self._reserve(s, "tasks", len(fresh))
            if not fresh:
                return [known[new.id] for new in tasks]
            leaders: dict[str, str] = {}
            keys = {
                leader_key(n.app_id, n.task_type, n.dedupe_key)
                for n in fresh
                if n.dedupe_key is not None
            }
            if keys:
                async for doc in db.tasks.find(
                    {"leader_key": _one_of(sorted(keys))}, {"leader_key": 1}, session=s
                ):
                    leaders[doc["leader_key"]] = doc["_id"]
            stored: list[Task] = []
            docs: list[Doc] = []
            edges: list[Doc] = []
            new_edges: dict[str, int] = {}  # dependency id -> edges this call adds
            writes = _Writes()
            for i, new in enumerate(fresh):
                alias_of = None
                if new.dedupe_key is not None:
                    key = leader_key(new.app_id, new.task_type, new.dedupe_key)
                    alias_of = leaders.get(key)
                    if alias_of is None:
                        leaders[key] = new.id
                # The edges to the dependencies not ended yet; the first one that ended
                # in a way that cancels this task (lifecycle.dependency_blocks).
                waiting = 0
                blocker: tuple[str, TaskStatus] | None = None
                for dependency in dict.fromkeys(new.after):
                    status = TaskStatus(dependencies[dependency]["status"])
                    blocks = dependency_blocks(status, new.after_always)
                    if blocks is None:
                        waiting += 1
                        new_edges[dependency] = new_edges.get(dependency, 0) + 1
                        edges.append(
                            {
                                "_id": dumps([dependency, new.id]),
                                "depends_on": dependency,
                                "task_id": new.id,
                                "always": new.after_always,
                            }
                        )
                    elif blocks and blocker is None:
                        blocker = (dependency, status)
                run_at = at if new.run_at is None else new.run_at
                t = enqueued(new, now=at, run_at=run_at, alias_of=alias_of)
                t = task(task_document(t, 0))  # the snapshot as it reads back
                writes.emit(EventKind.ENQUEUED, t)
                if blocker is not None:
                    t = _DEPENDENCY_CANCEL_PLAN.apply(
                        t,
                        at,
                        error=dependency_error(*blocker),
                        cancel_reason=DEPENDENCY_CANCEL_REASON,
                    )
                    writes.emit(DEPENDENCY_CANCELLATION.event, t)
                stored.append(t)
                doc = task_document(t, first + i)
                if waiting:
                    doc[_WAITING] = waiting
                docs.append(doc)
            await db.tasks.insert_many(docs, session=s)
            if edges:
                await db.dependencies.insert_many(edges, session=s)
            # Write each dependency that gains dependents, fenced by the status this
            # decision read: its end, in another transaction, writes it too, so the two
            # conflict (on MongoDB the second aborts and runs again on the new state)
            # and no release is lost to a dependency ending during this enqueue.
            for dependency, count in new_edges.items():
                result = await db.tasks.update_one(
                    {"_id": dependency, "status": dependencies[dependency]["status"]},
                    {"$inc": {_DEPENDENTS: count}},
                    session=s,
                )
                if result.matched_count != 1:
                    raise _Raced
            await self._record(s, writes, now)
            known.update((t.id, t) for t in stored)
            return [known[new.id] for new in tasks]

        return await self._transaction(body)

    async def _dependencies(
        self, s: AsyncClientSession, fresh: Sequence[NewTask]
    ) -> dict[str, Doc]:
        """The (status, app id) documents of every task ``fresh`` depends on; refuses a
        dependency that is not stored or is another app's (before anything is written)."""
        wanted = list(dict.fromkeys(d for new in fresh for d in new.after))
        if not wanted:
            return {}
        found = {
            d["_id"]: d
            async for d in self._database().tasks.find(
                {"_id": {"$in": wanted}}, {"status": 1, "app_id": 1}, session=s
            )
        }
        for new in fresh:
            for dependency in new.after:
                doc = found.get(dependency)
                if doc is None or doc["app_id"] != new.app_id:
                    raise unknown_dependency(
                        dependency, new.app_id, None if doc is None else doc["app_id"]
                    )
        return found

    async def claim_batch(self, request: ClaimRequest) -> list[Task]:
        types = sorted({task_type for _, task_type in request.handlers})
        if not types or request.limit <= 0:
            self._database()
            return []

        async def body(s: AsyncClientSession) -> list[Task]:
            db = self._database()
            now = await self._now()
            handlers = request.handlers
            tokens: dict[HandlerKey, float] = {}
            if request.limits:
                handlers, tokens = await self._limited(s, request, now)
                if not any(cap != 0 for cap in handlers.values()):
                    raise _Nothing([])
            suspended = [
                SuspensionScope(task_type=d["task_type"], app_id=d["app_id"])
                async for d in db.suspensions.find({}, session=s)
            ]
            # Planned on the claim index, whatever the history holds: ``alias_of: None``
            # also matches every finished task, so a planner must not pick ``aliases``.
            query: Doc = {
                "status": _eq(_PENDING),
                "task_type": _one_of(types),
                "alias_of": None,
                _WAITING: None,  # waits for no dependency (the field is absent)
                "run_at": {"$lte": now},
            }
            if request.min_priority is not None:
                query["priority"] = {"$gte": request.min_priority}
            counts: dict[HandlerKey, int] = {}
            picked: list[Doc] = []
            # Whole candidate documents, a page at a time (one round trip, no cursor
            # left open), the page doubling while the picks skip candidates: the
            # picked documents are returned without a read-back when all are claimed.
            skip, page = 0, max(request.limit, 16)
            while len(picked) < request.limit:
                found = (
                    await db.tasks.find(query, session=s)
                    .sort([("priority", DESCENDING), ("seq", ASCENDING)])
                    .hint("claim")
                    .skip(skip)
                    .limit(page)
                    .batch_size(page)
                    .to_list()
                )
                for doc in found:
                    app_id, task_type = doc["app_id"], doc["task_type"]
                    key: HandlerKey = (app_id, task_type)
                    if key not in handlers:
                        key = (None, task_type)
                        if key not in handlers:
                            continue
                    if any(scope.covers(app_id, task_type) for scope in suspended):
                        continue
                    cap = handlers[key]
                    if cap is not None and counts.get(key, 0) >= cap:
                        continue
                    counts[key] = counts.get(key, 0) + 1
                    picked.append(doc)
                    if len(picked) >= request.limit:
                        break
                if len(found) < page:
                    break  # no candidate left
                skip, page = skip + page, page * 2
            if not picked:
                raise _Nothing([])
            stamp: Doc = {
                "status": _RUNNING,
                "worker_id": request.worker_id,
                "started_at": now,
                "updated_at": now,
                "lease_expires_at": now + int(request.lease_seconds * 1_000_000),
                "claim_token": uuid.uuid4().hex,
            }
            result = await db.tasks.update_many(
                {"_id": {"$in": [d["_id"] for d in picked]}, "status": _PENDING, _WAITING: None},
                {"$set": stamp, "$inc": {"attempts": 1}},
                session=s,
            )
            if not result.modified_count:
                raise _Raced  # every pick was claimed by another worker since it was read
            if result.modified_count == len(picked):
                # All ours: what the update wrote, applied to what was read.
                claimed = [task({**d, **stamp, "attempts": d["attempts"] + 1}) for d in picked]
            else:
                # Read back by the token: the picks another worker took meanwhile are
                # not ours (on MongoDB such a race aborts the transaction instead).
                docs = {
                    d["_id"]: d
                    async for d in db.tasks.find({"claim_token": stamp["claim_token"]}, session=s)
                }
                claimed = [task(docs[d["_id"]]) for d in picked if d["_id"] in docs]
            if tokens:
                await self._spend(s, tokens, handlers, claimed, now)
            writes = _Writes()
            for t in claimed:
                writes.emit(EventKind.STARTED, t)
            await self._record(s, writes, now)
            return claimed

        return await self._transaction(body)

    async def _limited(
        self, s: AsyncClientSession, request: ClaimRequest, now: int
    ) -> tuple[dict[HandlerKey, int | None], dict[HandlerKey, float]]:
        """The request's caps cut by its global limits (:mod:`taskmill.limits`), and the
        refilled tokens of its rate-limited keys, inside claim transaction ``s``.

        Each limited key's bucket document (created full when missing) is *written*
        first (``$inc`` of ``claims``), in a stable order: two claims of one key both
        write it, so on MongoDB they cannot both commit from the same snapshot (the
        second aborts with a write conflict and runs again on the new state). That is
        what makes the tokens read and the RUNNING tasks counted here hold when this
        claim commits, in the role MySQL's ``FOR UPDATE`` on the bucket row plays."""
        db = self._database()
        seconds = now / 1_000_000
        tokens: dict[HandlerKey, float] = {}
        running: dict[HandlerKey, int] = {}
        for key in locked_keys(request.handlers, request.limits):
            scope, task_type = scope_of(key), key[1]
            # update_one then find_one: nx-27017 (the test stand-in) ignores
            # $setOnInsert in an upserting find_one_and_update.
            bucket_id = dumps([scope, task_type])
            await db.buckets.update_one(
                {"_id": bucket_id},
                {
                    "$inc": {"claims": 1},
                    # Empty as of the epoch: refilled to full by its first claim.
                    "$setOnInsert": {
                        "scope": scope,
                        "task_type": task_type,
                        "tokens": 0.0,
                        "updated_at": 0.0,
                    },
                },
                upsert=True,
                session=s,
            )
            bucket = await db.buckets.find_one({"_id": bucket_id}, session=s)
            assert bucket is not None
            limit = request.limits[key]
            if limit.rate is not None:
                stored = Bucket(float(bucket["tokens"]), float(bucket["updated_at"]))
                tokens[key] = refill(stored, limit.rate, seconds)
            if limit.max_running is not None:
                # An expired lease holds no slot, rescued or not.
                query: Doc = {
                    "status": _eq(_RUNNING),
                    "task_type": _eq(task_type),
                    "lease_expires_at": {"$gt": now},
                }
                if key[0] is not None:
                    query["app_id"] = key[0]
                running[key] = await db.tasks.count_documents(query, session=s)
        caps = limited_caps(request.handlers, request.limits, tokens=tokens, running=running)
        return caps, tokens

    async def _spend(
        self,
        s: AsyncClientSession,
        tokens: dict[HandlerKey, float],
        handlers: Mapping[HandlerKey, int | None],
        claimed: Sequence[Task],
        now: int,
    ) -> None:
        """Write back the buckets this claim took tokens from."""
        taken = taken_by_key(((t.app_id, t.task_type) for t in claimed), handlers)
        for key, left in tokens.items():
            if taken.get(key):
                await self._database().buckets.update_one(
                    {"_id": dumps([scope_of(key), key[1]])},
                    {"$set": {"tokens": spend(left, taken[key]), "updated_at": now / 1_000_000}},
                    session=s,
                )

    @staticmethod
    def _fence(lease: Lease) -> Doc:
        return {
            "_id": lease.task_id,
            "status": _RUNNING,
            "worker_id": lease.worker_id,
            "attempts": lease.attempt,
        }

    async def _held(self, s: AsyncClientSession, leases: Iterable[Lease]) -> dict[str, Doc]:
        wanted = {lease.task_id: lease for lease in leases}
        found: dict[str, Doc] = {}
        async for doc in self._database().tasks.find({"_id": {"$in": list(wanted)}}, session=s):
            lease = wanted[doc["_id"]]
            if (
                doc["status"] == _RUNNING
                and doc["worker_id"] == lease.worker_id
                and doc["attempts"] == lease.attempt
            ):
                found[doc["_id"]] = doc
        return found

    async def finish_batch(self, finishes: Sequence[Finish]) -> list[Task | None]:
        if not finishes:
            self._database()
            return []

        async def body(s: AsyncClientSession) -> list[Task | None]:
            now = await self._now()
            held = await self._held(s, (f.lease for f in finishes))
            writes = _Writes(replacements=[])  # the finishes' writes go as one bulk_write
            results: list[Task | None] = []
            for finish in finishes:
                doc = held.get(finish.lease.task_id)
                if (
                    doc is None
                    or doc["worker_id"] != finish.lease.worker_id
                    or doc["attempts"] != finish.lease.attempt
                ):
                    results.append(None)
                    continue
                kind = finish.kind
                if doc["cancel_reason"] is not None:
                    kind = finish_kind(kind, stop_requested=True)
                chosen = _FINISH_PLANS[kind]
                extra: dict[str, Any] = {}
                if finish.data is not None:
                    extra["data"] = finish.data
                if finish.progress is not None:
                    extra["progress"] = finish.progress
                if kind is FinishKind.COMPLETE:
                    extra["result"] = (
                        None if finish.result_json is None else loads(finish.result_json)
                    )
                elif kind is FinishKind.RETRY:
                    extra["run_later"] = from_micros(now + int(finish.retry_in * 1_000_000))
                new = await self._settle(
                    s,
                    doc,
                    chosen,
                    now,
                    writes,
                    error=finish.error,
                    cancel_reason=finish.cancel_reason or DEFAULT_CANCEL_REASON,
                    **extra,
                )
                outcome = chosen.transition.outcome or finish.outcome
                writes.attempts.append(
                    Attempt(
                        task_id=new.id,
                        number=finish.lease.attempt,
                        worker_id=finish.lease.worker_id,
                        started_at=finish.started_at,
                        finished_at=finish.finished_at,
                        outcome=outcome,
                        error=finish.error if outcome is not AttemptOutcome.COMPLETED else None,
                    )
                )
                del held[new.id]
                results.append(new)
            if not writes.events:
                raise _Nothing(results)
            await self._record(s, writes, now)
            return results

        return await self._transaction(body)

    async def _leases(
        self, leases: Sequence[Lease], lease_seconds: float | None
    ) -> dict[str, CancelReason | None]:
        if not leases:
            self._database()
            return {}

        async def run() -> dict[str, CancelReason | None]:
            db = self._database()
            # The ids first: searched on _id (the stand-in scans the collection for an
            # $or alone), the fences then checked on those documents.
            ids = list(dict.fromkeys(lease.task_id for lease in leases))
            fences = {"_id": {"$in": ids}, "$or": [self._fence(lease) for lease in leases]}
            if lease_seconds is not None:
                until = await self._now() + int(lease_seconds * 1_000_000)
                await db.tasks.update_many(fences, {"$set": {"lease_expires_at": until}})
            # Read by _id alone and the same fences checked here: a find with the $or
            # makes nx-27017 (the test stand-in) filter every document of the
            # collection in Python, whatever the _id $in beside it (explain: SCAN
            # tasks; 3-9 s per lease check with 200,000 finished tasks, every other
            # command waiting). On MongoDB both are the same _id index lookup. (Its
            # update_many above is searched on _id by the stand-in.)
            fields = {"cancel_reason": 1, "app_id": 1, "task_type": 1}
            fenced = {(lease.task_id, _RUNNING, lease.worker_id, lease.attempt) for lease in leases}
            held = {
                d["_id"]: d
                async for d in db.tasks.find(
                    {"_id": {"$in": ids}}, {**fields, "status": 1, "worker_id": 1, "attempts": 1}
                )
                if (d["_id"], d["status"], d["worker_id"], d["attempts"]) in fenced
            }
            suspended = (
                [
                    SuspensionScope(task_type=d["task_type"], app_id=d["app_id"])
                    async for d in db.suspensions.find({})
                ]
                if held
                else []
            )
            answer: dict[str, CancelReason | None] = {}
            for task_id, doc in held.items():
                reason = doc["cancel_reason"]
                if reason is not None:
                    answer[task_id] = CancelReason(reason)
                elif any(sc.covers(doc["app_id"], doc["task_type"]) for sc in suspended):
                    answer[task_id] = CancelReason.SUSPENDED
                else:
                    answer[task_id] = None
            return answer

        return await self._read(run())

    async def renew_leases(
        self, leases: Sequence[Lease], lease_seconds: float
    ) -> dict[str, CancelReason | None]:
        return await self._leases(leases, lease_seconds)

    async def watch_leases(self, leases: Sequence[Lease]) -> dict[str, CancelReason | None]:
        return await self._leases(leases, None)

    async def save_progress(self, updates: Sequence[ProgressUpdate]) -> set[str]:
        if not updates:
            self._database()
            return set()

        async def body(s: AsyncClientSession) -> set[str]:
            now = await self._now()
            at = from_micros(now)
            held = await self._held(s, (u.lease for u in updates))
            writes = _Writes(replacements=[])
            written: set[str] = set()
            for update in updates:
                doc = held.get(update.lease.task_id)
                if doc is None:
                    continue
                changes: dict[str, Any] = {"updated_at": at}
                if update.progress is not None:
                    changes["progress"] = update.progress
                if update.data is not None:
                    changes["data"] = update.data
                new = task(doc).evolve(**changes)
                await self._replace(s, doc, new, writes)
                held[new.id] = task_document(new, doc["seq"])
                writes.emit(EventKind.PROGRESS, new)
                written.add(new.id)
            if not written:
                raise _Nothing(written)
            await self._record(s, writes, now)
            return written

        return await self._transaction(body)

    async def rescue_expired(self, *, limit: int = 1000) -> list[Task]:
        async def body(s: AsyncClientSession) -> list[Task]:
            db = self._database()
            now = await self._now()
            at = from_micros(now)
            expired = (
                await db.tasks.find(
                    {"status": _eq(_RUNNING), "lease_expires_at": {"$lte": now}}, session=s
                )
                .sort("seq", ASCENDING)
                .hint("lease")
                .limit(max(limit, 0))
                .to_list()
            )
            if not expired:
                raise _Nothing([])
            writes = _Writes(replacements=[])
            rescued: list[Task] = []
            for doc in expired:
                old = task(doc)
                chosen = _RESCUE_PLANS[
                    rescue_case(old.cancel_reason, old.attempts, old.max_retries)
                ]
                new = await self._settle(s, doc, chosen, now, writes, error=RESCUE_ERROR)
                assert chosen.transition.outcome is not None
                writes.attempts.append(
                    Attempt(
                        task_id=old.id,
                        number=old.attempts,
                        worker_id=old.worker_id or "",
                        started_at=old.started_at or at,
                        finished_at=at,
                        outcome=chosen.transition.outcome,
                        error=RESCUE_ERROR,
                    )
                )
                rescued.append(new)
            await self._record(s, writes, now)
            return rescued

        if limit <= 0:
            self._database()
            return []
        return await self._transaction(body)

    async def retry(self, task_id: str) -> Task:
        async def body(s: AsyncClientSession) -> Task:
            db = self._database()
            doc = await db.tasks.find_one({"_id": task_id}, session=s)
            if doc is None:
                raise TaskNotFound(f"no task {task_id}")
            old = task(doc)
            check_redrive(task_id, old.status, old.alias_of)
            if old.dedupe_key is not None:
                key = leader_key(old.app_id, old.task_type, old.dedupe_key)
                leader = await db.tasks.find_one({"leader_key": key}, {"_id": 1}, session=s)
                if leader is not None:
                    raise key_taken(task_id, leader["_id"], old.dedupe_key)
            now = await self._now()
            at = from_micros(now)
            new = old.evolve(
                status=TaskStatus.PENDING,
                attempts=0,
                result=None,
                error=None,
                cancel_reason=None,
                progress=NO_PROGRESS,
                run_at=at,
                updated_at=at,
                started_at=None,
                finished_at=None,
            )
            await self._replace(s, doc, new)
            writes = _Writes()
            writes.emit(REDRIVE_EVENT, new)
            await self._record(s, writes, now)
            return new

        return await self._transaction(body)

    # -- reading ---------------------------------------------------------------------

    async def get(self, task_id: str) -> Task | None:
        doc = await self._read(self._database().tasks.find_one({"_id": task_id}))
        return None if doc is None else task(doc)

    async def query(
        self,
        filter: TaskFilter,
        *,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
        after: str | None = None,
    ) -> list[Task]:
        db = self._database()

        async def run() -> list[Task]:
            selection = _filter_query(filter)
            if after is not None:
                place = await db.tasks.find_one({"_id": after}, {"seq": 1})
                if place is None:
                    return []
                bound = {"seq": {"$lt" if newest_first else "$gt": place["seq"]}}
                selection = {"$and": [selection, bound]} if selection else bound
            if limit <= 0:
                return []
            cursor = (
                db.tasks.find(selection)
                .sort("seq", DESCENDING if newest_first else ASCENDING)
                .skip(max(offset, 0))
                .limit(limit)
            )
            return [task(doc) async for doc in cursor]

        return await self._read(run())

    async def summary(self, filter: TaskFilter) -> ProgressSummary:
        db = self._database()

        async def run() -> ProgressSummary:
            counts = dict.fromkeys(TaskStatus, 0)
            pipeline: list[Doc] = [
                {"$match": _filter_query(filter)},
                {"$group": {"_id": "$status", "n": {"$sum": 1}}},
            ]
            async for row in await db.tasks.aggregate(pipeline):
                counts[TaskStatus(row["_id"])] += int(row["n"])
            waiting = 0
            if counts[TaskStatus.PENDING]:
                blocked: Doc = {"status": _eq(_PENDING), _WAITING: {"$gt": 0}}
                selection = _filter_query(filter)
                waiting = await db.tasks.count_documents(
                    {"$and": [selection, blocked]} if selection else blocked
                )
            return ProgressSummary.from_counts(counts, waiting=waiting)

        return await self._read(run())

    async def attempts(self, task_id: str) -> list[Attempt]:
        db = self._database()

        async def run() -> list[Attempt]:
            cursor = db.attempts.find({"task_id": task_id}).sort(
                [("number", ASCENDING), ("seq", ASCENDING), ("_id", ASCENDING)]
            )
            return [
                Attempt(
                    task_id,
                    d["number"],
                    d["worker_id"],
                    from_micros(d["started_at"]),
                    from_micros(d["finished_at"]),
                    AttemptOutcome(d["outcome"]),
                    d["error"],
                )
                async for d in cursor
            ]

        return await self._read(run())

    async def next_run_at(self, handlers: Sequence[HandlerKey]) -> datetime | None:
        db = self._database()
        keys = set(handlers)
        types = sorted({t for _, t in keys})
        if not types:
            return None

        async def run() -> datetime | None:
            suspended = [
                SuspensionScope(task_type=d["task_type"], app_id=d["app_id"])
                async for d in db.suspensions.find({})
            ]
            cursor = (
                db.tasks.find(
                    {
                        "status": _eq(_PENDING),
                        "task_type": _one_of(types),
                        "alias_of": None,
                        _WAITING: None,
                    },
                    {"app_id": 1, "task_type": 1, "run_at": 1},
                )
                .sort([("run_at", ASCENDING), ("seq", ASCENDING)])
                .hint("claim")
            )
            async for doc in cursor:
                app_id, task_type = doc["app_id"], doc["task_type"]
                if (app_id, task_type) not in keys and (None, task_type) not in keys:
                    continue
                if any(sc.covers(app_id, task_type) for sc in suspended):
                    continue
                await cursor.close()
                return from_micros(doc["run_at"])
            return None

        return await self._read(run())

    # -- retention -------------------------------------------------------------------

    async def cleanup(
        self,
        older_than: timedelta,
        *,
        statuses: frozenset[TaskStatus] = frozenset({TaskStatus.COMPLETED, TaskStatus.CANCELLED}),
    ) -> int:
        if any(s.active for s in statuses):
            raise ValueError("cleanup deletes terminal tasks only")
        self._database()

        async def body(s: AsyncClientSession) -> int:
            db = self._database()
            cutoff = await self._now() - int(older_than.total_seconds() * 1_000_000)
            doomed = [
                d["_id"]
                async for d in db.tasks.find(
                    {
                        "status": {"$in": sorted(st.value for st in statuses)},
                        "finished_at": {"$lt": cutoff},
                    },
                    {"_id": 1},
                    session=s,
                )
            ]
            if not doomed:
                raise _Nothing(0)
            await db.attempts.delete_many({"task_id": {"$in": doomed}}, session=s)
            # The edges of doomed dependents (a doomed task's own dependents' edges were
            # resolved when it ended).
            await db.dependencies.delete_many({"task_id": {"$in": doomed}}, session=s)
            result = await db.tasks.delete_many({"_id": {"$in": doomed}}, session=s)
            return int(result.deleted_count)

        return await self._transaction(body)

    # -- control -----------------------------------------------------------------------

    async def cancel(
        self,
        *,
        task_ids: Sequence[str] | None = None,
        filter: TaskFilter | None = None,
        reason: CancelReason = CancelReason.USER,
        cascade: bool = True,
    ) -> list[Task]:
        if task_ids is None and filter is None:
            raise ValueError("cancel needs task_ids or a filter")

        async def body(s: AsyncClientSession) -> list[Task]:
            return await self._cancel_in(s, task_ids, filter, reason, cascade)

        return await self._transaction(body)

    async def _cancel_in(
        self,
        s: AsyncClientSession,
        task_ids: Sequence[str] | None,
        filter: TaskFilter | None,
        reason: CancelReason,
        cascade: bool,
    ) -> list[Task]:
        """``cancel`` inside transaction ``s``."""
        db = self._database()
        now = await self._now()
        at = from_micros(now)
        selected = list(task_ids or ())
        if filter is not None:
            query = _filter_query(filter)
            active = {"status": {"$in": _ACTIVE}}
            query = {"$and": [query, active]} if query else active
            selected.extend(
                [d["_id"] async for d in db.tasks.find(query, {"_id": 1}, session=s).sort("seq", 1)]
            )

        async def children_of(level: list[str]) -> list[tuple[str, str]]:
            cursor = db.tasks.find(
                {"parent_id": _one_of(level)}, {"_id": 1, "parent_id": 1}, session=s
            ).sort("seq", ASCENDING)
            return [(d["_id"], d["parent_id"]) async for d in cursor]

        targets = await cancel_targets(selected, children_of if cascade else None)
        writes = _Writes()
        changed: list[Task] = []
        settled: set[str] = set()
        for task_id in targets:
            if task_id in settled:
                continue
            doc = await db.tasks.find_one({"_id": task_id}, session=s)
            if doc is None or doc["status"] not in _ACTIVE:
                continue
            old = task(doc)
            if not reason.terminal:
                if old.status is TaskStatus.RUNNING and old.cancel_reason is None:
                    new = old.evolve(cancel_reason=reason, updated_at=at)
                    await self._replace(s, doc, new)
                    writes.emit(EventKind.CANCEL_REQUESTED, new)
                    changed.append(new)
                continue
            if old.status is TaskStatus.RUNNING:
                writes.attempts.append(
                    Attempt(
                        task_id=task_id,
                        number=old.attempts,
                        worker_id=old.worker_id or "",
                        started_at=old.started_at or at,
                        finished_at=at,
                        outcome=_CANCELLED_OUTCOME,
                        error=cancel_error(reason),
                    )
                )
            aliases = len(writes.settled_aliases)
            dependents = len(writes.dependents_cancelled)
            new = await self._settle(s, doc, _CANCEL_PLAN, now, writes, cancel_reason=reason)
            changed.append(new)
            for alias in writes.settled_aliases[aliases:]:
                settled.add(alias.id)
                changed.append(alias)
            changed += writes.dependents_cancelled[dependents:]
        if not changed:
            raise _Nothing(changed)
        await self._record(s, writes, now)
        return changed

    async def suspend(self, scope: SuspensionScope) -> int:
        async def body(s: AsyncClientSession) -> int:
            db = self._database()
            await db.suspensions.replace_one(
                {"_id": _scope_id(scope)},
                {"_id": _scope_id(scope), "task_type": scope.task_type, "app_id": scope.app_id},
                upsert=True,
                session=s,
            )
            query: Doc = {"status": _RUNNING}
            if scope.task_type is not None:
                query["task_type"] = scope.task_type
            if scope.app_id is not None:
                query["app_id"] = scope.app_id
            running = [d["_id"] async for d in db.tasks.find(query, {"_id": 1}, session=s)]
            if not running:
                return 0
            try:
                changed = await self._cancel_in(s, running, None, CancelReason.SUSPENDED, False)
            except _Nothing:
                return 0  # the suspension itself is written: commit it
            return len(changed)

        return await self._transaction(body)

    async def resume(self, scope: SuspensionScope) -> bool:
        db = self._database()
        result = await self._guard(db.suspensions.delete_one({"_id": _scope_id(scope)}))
        return bool(result.deleted_count)

    async def suspensions(self) -> list[SuspensionScope]:
        db = self._database()

        async def run() -> list[SuspensionScope]:
            found = [
                SuspensionScope(task_type=d["task_type"], app_id=d["app_id"])
                async for d in db.suspensions.find({})
            ]
            return sorted(found, key=lambda sc: (sc.task_type or "", sc.app_id or ""))

        return await self._read(run())

    async def read_events(
        self, after: str | None, *, limit: int = 1000
    ) -> tuple[list[TaskEvent], str]:
        db = self._database()
        position = None if after is None else token_position(after)

        async def run() -> tuple[list[TaskEvent], str]:
            if position is None:
                counter = await db.counters.find_one({"_id": "events"})
                return [], position_token(0 if counter is None else int(counter["value"]))
            if limit <= 0:
                return [], after or position_token(position)
            rows = (
                await db.events.find({"_id": {"$gt": position}})
                .sort("_id", ASCENDING)
                .limit(limit)
                .to_list()
            )
            ids = sorted({r["task_id"] for r in rows})
            snapshots = {d["_id"]: task(d) async for d in db.tasks.find({"_id": {"$in": ids}})}
            events: list[TaskEvent] = []
            cursor = after or position_token(position)
            for row in rows:
                cursor = position_token(int(row["_id"]))
                snapshot = snapshots.get(row["task_id"])
                if snapshot is not None:
                    events.append(
                        TaskEvent(
                            kind=EventKind(row["kind"]),
                            task=snapshot,
                            status=TaskStatus(row["status"]),
                            at=from_micros(row["at"]),
                            cursor=cursor,
                        )
                    )
            return events, cursor

        return await self._read(run())

    async def prune_events(self, older_than: timedelta) -> int:
        db = self._database()

        async def run() -> int:
            cutoff = await self._now() - int(older_than.total_seconds() * 1_000_000)
            result = await db.events.delete_many({"at": {"$lt": cutoff}})
            return int(result.deleted_count)

        return await self._guard(run())

    # -- handler registrations -----------------------------------------------------------

    async def put_handler_registration(
        self, registration: HandlerRegistration
    ) -> HandlerRegistration:
        db = self._database()
        now = await self._now()
        stored = attrs.evolve(registration, updated_at=from_micros(now))
        await self._guard(
            db.handlers.replace_one(
                {"_id": dumps([stored.app_id, stored.task_type])},
                {
                    "_id": dumps([stored.app_id, stored.task_type]),
                    "app_id": stored.app_id,
                    "task_type": stored.task_type,
                    "url": stored.url,
                    "timeout": stored.timeout,
                    "max_retries": stored.max_retries,
                    "concurrency": stored.concurrency,
                    "updated_at": now,
                },
                upsert=True,
            )
        )
        return stored

    async def delete_handler_registration(self, app_id: str | None, task_type: str) -> bool:
        db = self._database()
        result = await self._guard(db.handlers.delete_one({"_id": dumps([app_id, task_type])}))
        return bool(result.deleted_count)

    async def handler_registrations(self) -> list[HandlerRegistration]:
        db = self._database()

        async def run() -> list[HandlerRegistration]:
            found = [
                HandlerRegistration(
                    task_type=d["task_type"],
                    url=d["url"],
                    app_id=d["app_id"],
                    timeout=d["timeout"],
                    max_retries=d["max_retries"],
                    concurrency=d["concurrency"],
                    updated_at=from_micros(d["updated_at"]),
                )
                async for d in db.handlers.find({})
            ]
            return sorted(found, key=lambda r: (r.app_id is not None, r.app_id or "", r.task_type))

        return await self._read(run())
