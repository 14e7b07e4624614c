"""``mongodb://`` — taskmill on MongoDB through PyMongo's async API.

Every operation that changes state is one multi-document transaction, run with the
driver's retry rules (:mod:`taskmill_mongo.transactions`). Inside it the operation reads
the task documents it needs, decides with the lifecycle kernel (:mod:`taskmill.lifecycle`)
exactly as the memory store does, and writes each changed document back fenced by the
(status, attempts, worker id) it read.

:class:`MongoStorage` holds one method per operation of the storage contract; the
operations of several steps live in the module of their concern:

- :mod:`~taskmill_mongo.enqueue`: inserting tasks, with dedupe and dependencies;
- :mod:`~taskmill_mongo.claims`: claims, under caps, suspensions and global limits;
- :mod:`~taskmill_mongo.leases`: finishes, lease renewals and checks, progress, rescue;
- :mod:`~taskmill_mongo.cancellation`: cancels and suspensions;
- :mod:`~taskmill_mongo.settlement`: a transition's consequences (aliases, dependents);
- :mod:`~taskmill_mongo.connection`: the client, the server's clock, driver errors;
- :mod:`~taskmill_mongo.schema`: collections, indexes and their version;
- :mod:`~taskmill_mongo.writer_lock`: the test stand-in's writer lock
  (``serialize_writes``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar, Final, Self

import attrs
from pymongo import ASCENDING, DESCENDING
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.common import MAX_BSON_SIZE
from taskmill.errors import TaskNotFound
from taskmill.lifecycle import REDRIVE_EVENT, check_redrive, key_taken
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
from taskmill.serialization import dumps
from taskmill.storage import (
    ChangeListener,
    ClaimRequest,
    Finish,
    HandlerKey,
    HandlerRegistration,
    Lease,
    NewTask,
    ProgressUpdate,
    StorageCapabilities,
    StoredWorker,
    TaskStorage,
)

from taskmill_mongo import claims, enqueue, leases, schema
from taskmill_mongo.cancellation import cancel_in, suspend_in
from taskmill_mongo.connection import Connection
from taskmill_mongo.documents import (
    EventKey,
    from_micros,
    leader_key,
    task,
    tombstone_task,
    value_ceiling,
)
from taskmill_mongo.listener import MongoChangeListener
from taskmill_mongo.options import MongoOptions, parse_url, redact
from taskmill_mongo.queries import PENDING, eq, filter_query, one_of, scope_id
from taskmill_mongo.schema import SCHEMA_VERSION, WAITING, Doc
from taskmill_mongo.transactions import (
    Nothing,
    Writes,
    check_transactions,
    outside_transactions,
    read,
    read_log,
    record,
    replace,
    transaction,
)
from taskmill_mongo.writer_lock import LOCK_SECONDS

__all__ = ["SCHEMA_VERSION", "MongoStorage"]

_COLLECTIONS: Final = schema.COLLECTIONS
"""Kept under its old name: tests/test_contract_mongo.py imports it from here."""
_LOCK_SECONDS: Final = LOCK_SECONDS
"""Kept under its old name: tests/reliability/test_regressions.py imports it from here."""


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
        worker_registry=True,
    )

    def __init__(self, options: MongoOptions) -> None:
        self.url = options.url
        self.options = options
        self.database = options.database
        self._conn = Connection(options)

    def __repr__(self) -> str:
        return f"MongoStorage({redact(self.url)!r})"

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        return cls(parse_url(url, options))

    def _database(self) -> AsyncDatabase[Doc]:
        """The open database (the chaos harness reads the writer lock through it)."""
        return self._conn.database()

    async def _lock(self, db: AsyncDatabase[Doc]) -> str:
        """Take the writer lock (tests/reliability/test_regressions.py holds it so)."""
        return await self._conn.writer_lock.acquire(db)

    # -- lifecycle -------------------------------------------------------------------

    async def exists(self) -> bool:
        client = self._conn.new_client()
        try:
            names = await self._conn.guard(client[self.database].list_collection_names())
        finally:
            await client.close()
        return "taskmill_meta" in names

    async def open(self, *, auto_migrate: bool = False) -> None:
        conn = self._conn
        if conn.db is not None:
            return
        client = conn.new_client()
        db = client[self.database]
        try:
            version = await conn.guard(schema.stored_version(db, self.url))
            await conn.guard(check_transactions(conn, db))
            if version is None or (version < SCHEMA_VERSION and auto_migrate):
                await conn.guard(schema.create(db))
            else:
                schema.check_version(version, self.database, self.url)
            hello = await conn.guard(conn.sync_clock(db))
            offered = await conn.guard(schema.change_streams_offered(db))
        except BaseException:
            await client.close()
            raise
        conn.max_document = int(hello.get("maxBsonObjectSize", MAX_BSON_SIZE))
        # Per instance, shadowing the class's declaration: the core and the contract
        # suite read ``storage.capabilities`` from the store object.
        vars(self)["capabilities"] = attrs.evolve(
            type(self).capabilities,
            notifications=offered,
            max_value_bytes=value_ceiling(conn.max_document),
        )
        conn.client, conn.db = client, db

    async def close(self) -> None:
        client, self._conn.client, self._conn.db = self._conn.client, None, None
        if client is not None:
            await client.close()

    async def change_listener(self) -> ChangeListener | None:
        """A :class:`~taskmill_mongo.listener.MongoChangeListener` (change streams,
        on a client of its own), or None when the server refused change streams at
        :meth:`open`."""
        self._conn.database()
        if not self.capabilities.notifications:
            return None
        conn = self._conn
        opening = (
            functools.partial(outside_transactions, conn) if conn.options.serialize_writes else None
        )
        return await MongoChangeListener.open(conn.new_client, self.database, opening=opening)

    async def migrate(self) -> int:
        conn = self._conn
        client = conn.new_client()
        db = client[self.database]
        try:
            version = await conn.guard(schema.stored_version(db, self.url))
            if version is not None and version > SCHEMA_VERSION:
                schema.check_version(version, self.database, self.url)
            await conn.guard(schema.create(db))
            stored = await conn.guard(schema.stored_version(db, self.url))
            assert stored is not None
            schema.check_version(stored, self.database, self.url)
            return stored
        finally:
            await client.close()

    # -- writing tasks ---------------------------------------------------------------

    async def enqueue(self, tasks: Sequence[NewTask]) -> list[Task]:
        if not tasks:
            self._conn.database()
            return []
        return await enqueue.enqueue(self._conn, tasks)

    async def claim_batch(self, request: ClaimRequest) -> list[Task]:
        types = sorted({task_type for _, task_type in request.handlers})
        if not types or request.limit <= 0:
            self._conn.database()
            return []
        return await claims.claim_batch(self._conn, request, types)

    async def finish_batch(self, finishes: Sequence[Finish]) -> list[Task | None]:
        if not finishes:
            self._conn.database()
            return []
        return await leases.finish_batch(self._conn, finishes)

    async def renew_leases(
        self, leases: Sequence[Lease], lease_seconds: float
    ) -> dict[str, CancelReason | None]:
        return await self._leases(leases, lease_seconds)

    async def watch_leases(self, leases: Sequence[Lease]) -> dict[str, CancelReason | None]:
        return await self._leases(leases, None)

    async def _leases(
        self, held: Sequence[Lease], lease_seconds: float | None
    ) -> dict[str, CancelReason | None]:
        if not held:
            self._conn.database()
            return {}
        return await leases.check_leases(self._conn, held, lease_seconds)

    async def save_progress(self, updates: Sequence[ProgressUpdate]) -> set[str]:
        if not updates:
            self._conn.database()
            return set()
        return await leases.save_progress(self._conn, updates)

    async def rescue_expired(self, *, limit: int = 1000) -> list[Task]:
        if limit <= 0:
            self._conn.database()
            return []
        return await leases.rescue_expired(self._conn, limit)

    async def retry(self, task_id: str) -> Task:
        async def body(s: AsyncClientSession) -> Task:
            db = self._conn.database()
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
            now = await self._conn.now()
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
            await replace(db, s, doc, new)
            writes = Writes()
            writes.emit(REDRIVE_EVENT, new)
            await record(db, s, writes, now)
            return new

        return await transaction(self._conn, body)

    # -- reading ---------------------------------------------------------------------

    async def get(self, task_id: str) -> Task | None:
        doc = await read(self._conn, self._conn.database().tasks.find_one({"_id": task_id}))
        return None if doc is None else task(doc)

    async def deleted_task(self, task_id: str) -> Task | None:
        tombstones = self._conn.database().tombstones
        doc = await read(self._conn, tombstones.find_one({"_id": task_id}))
        return None if doc is None else tombstone_task(doc)

    async def query(
        self,
        filter: TaskFilter,
        *,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
        after: str | None = None,
    ) -> list[Task]:
        db = self._conn.database()

        async def run() -> list[Task]:
            selection = filter_query(filter)
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

        return await read(self._conn, run())

    async def summary(self, filter: TaskFilter) -> ProgressSummary:
        db = self._conn.database()

        async def run() -> ProgressSummary:
            counts = dict.fromkeys(TaskStatus, 0)
            pipeline: list[Doc] = [
                {"$match": filter_query(filter)},
                {"$group": {"_id": "$status", "n": {"$sum": 1}}},
            ]
            async for row in await db.tasks.aggregate(pipeline):
                counts[TaskStatus(row["_id"])] += int(row["n"])
            waiting = 0
            if counts[TaskStatus.PENDING]:
                blocked: Doc = {"status": eq(PENDING), WAITING: {"$gt": 0}}
                selection = filter_query(filter)
                waiting = await db.tasks.count_documents(
                    {"$and": [selection, blocked]} if selection else blocked
                )
            return ProgressSummary.from_counts(counts, waiting=waiting)

        return await read(self._conn, run())

    async def attempts(self, task_id: str) -> list[Attempt]:
        db = self._conn.database()

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

        return await read(self._conn, run())

    async def next_run_at(self, handlers: Sequence[HandlerKey]) -> datetime | None:
        db = self._conn.database()
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
                        "status": eq(PENDING),
                        "task_type": one_of(types),
                        "alias_of": None,
                        WAITING: None,
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

        return await read(self._conn, run())

    # -- retention -------------------------------------------------------------------

    async def cleanup(
        self,
        older_than: timedelta,
        *,
        statuses: frozenset[TaskStatus] = frozenset({TaskStatus.COMPLETED, TaskStatus.CANCELLED}),
    ) -> int:
        if any(s.active for s in statuses):
            raise ValueError("cleanup deletes terminal tasks only")
        self._conn.database()

        async def body(s: AsyncClientSession) -> int:
            db = self._conn.database()
            cutoff = await self._conn.now() - int(older_than.total_seconds() * 1_000_000)
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
                raise Nothing(0)
            await db.attempts.delete_many({"task_id": {"$in": doomed}}, session=s)
            # The edges of doomed dependents (a doomed task's own dependents' edges were
            # resolved when it ended).
            await db.dependencies.delete_many({"task_id": {"$in": doomed}}, session=s)
            result = await db.tasks.delete_many({"_id": {"$in": doomed}}, session=s)
            return int(result.deleted_count)

        return await transaction(self._conn, body)

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
            return await cancel_in(self._conn, s, task_ids, filter, reason, cascade)

        return await transaction(self._conn, body)

    async def suspend(self, scope: SuspensionScope) -> int:
        async def body(s: AsyncClientSession) -> int:
            return await suspend_in(self._conn, s, scope)

        return await transaction(self._conn, body)

    async def resume(self, scope: SuspensionScope) -> bool:
        db = self._conn.database()
        result = await self._conn.guard(db.suspensions.delete_one({"_id": scope_id(scope)}))
        return bool(result.deleted_count)

    async def suspensions(self) -> list[SuspensionScope]:
        db = self._conn.database()

        async def run() -> list[SuspensionScope]:
            found = [
                SuspensionScope(task_type=d["task_type"], app_id=d["app_id"])
                async for d in db.suspensions.find({})
            ]
            return sorted(found, key=lambda sc: (sc.task_type or "", sc.app_id or ""))

        return await read(self._conn, run())

    async def read_events(
        self, after: str | None, *, limit: int = 1000
    ) -> tuple[list[TaskEvent], str]:
        db = self._conn.database()
        start = None if after is None else EventKey.from_token(after)
        if start is not None and limit <= 0:
            return [], start.token()

        async def run() -> tuple[list[TaskEvent], str]:
            rows, end = await read_log(self._conn, start, limit)
            ids = sorted({r["task_id"] for r in rows})
            snapshots = (
                {d["_id"]: task(d) async for d in db.tasks.find({"_id": {"$in": ids}})}
                if ids
                else {}
            )
            # A task deleted by its finish (Finish.delete): its tombstone, read after
            # the tasks, so a task deleted in between is found there. Tasks deleted by
            # cleanup have none, and their events are skipped.
            gone = [i for i in ids if i not in snapshots]
            if gone:
                buried = db.tombstones.find({"_id": {"$in": gone}})
                snapshots.update({d["_id"]: tombstone_task(d) async for d in buried})
            events: list[TaskEvent] = []
            for row in rows:
                snapshot = snapshots.get(row["task_id"])
                if snapshot is not None:
                    events.append(
                        TaskEvent(
                            kind=EventKind(row["kind"]),
                            task=snapshot,
                            status=TaskStatus(row["status"]),
                            at=from_micros(row["at"]),
                            cursor=EventKey.from_document_id(row["_id"]).token(),
                        )
                    )
            return events, end.token()

        return await read(self._conn, run())

    async def prune_events(self, older_than: timedelta) -> int:
        db = self._conn.database()

        async def run() -> int:
            cutoff = await self._conn.now() - int(older_than.total_seconds() * 1_000_000)
            result = await db.events.delete_many({"at": {"$lt": cutoff}})
            # A tombstone's deleted_at is the time of its task's last events.
            await db.tombstones.delete_many({"deleted_at": {"$lt": cutoff}})
            return int(result.deleted_count)

        return await self._conn.guard(run())

    # -- handler registrations -----------------------------------------------------------

    async def put_handler_registration(
        self, registration: HandlerRegistration
    ) -> HandlerRegistration:
        db = self._conn.database()
        now = await self._conn.now()
        stored = attrs.evolve(registration, updated_at=from_micros(now))
        await self._conn.guard(
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
        db = self._conn.database()
        result = await self._conn.guard(db.handlers.delete_one({"_id": dumps([app_id, task_type])}))
        return bool(result.deleted_count)

    async def handler_registrations(self) -> list[HandlerRegistration]:
        db = self._conn.database()

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

        return await read(self._conn, run())

    # -- the worker registry (collection ``workers``, schema version 5) -----------------
    # Each is one command outside any transaction, run by ``read``: with
    # ``serialize_writes`` under the writer lock, so that on the stand-in it never lands
    # inside another client's open transaction. The heartbeat is the store clock
    # (``Connection.now``: the server's ``hello`` localTime offset, as for leases).

    async def put_worker(self, worker_id: str, record: str) -> None:
        """Replace the registration of ``worker_id``, its heartbeat the store clock."""
        db = self._conn.database()

        async def run() -> None:
            now = await self._conn.now()
            await db.workers.replace_one(
                {"_id": worker_id},
                {"_id": worker_id, "heartbeat_at": now, "record": record},
                upsert=True,
            )

        await read(self._conn, run())

    async def workers(self) -> list[StoredWorker]:
        """Every registration, by worker id."""
        db = self._conn.database()

        async def run() -> list[StoredWorker]:
            found = [
                StoredWorker(
                    id=d["_id"], heartbeat_at=from_micros(d["heartbeat_at"]), record=d["record"]
                )
                async for d in db.workers.find({})
            ]
            return sorted(found, key=lambda w: w.id)

        return await read(self._conn, run())

    async def remove_worker(self, worker_id: str) -> bool:
        """Delete the registration of ``worker_id``; whether there was one."""
        db = self._conn.database()

        async def run() -> bool:
            result = await db.workers.delete_one({"_id": worker_id})
            return bool(result.deleted_count)

        return await read(self._conn, run())

    async def prune_workers(self, older_than: timedelta) -> int:
        """Delete registrations whose heartbeat is older than ``older_than``."""
        db = self._conn.database()

        async def run() -> int:
            cutoff = await self._conn.now() - int(older_than.total_seconds() * 1_000_000)
            result = await db.workers.delete_many({"heartbeat_at": {"$lt": cutoff}})
            return int(result.deleted_count)

        return await read(self._conn, run())
