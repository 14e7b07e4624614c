"""The collections and indexes of a taskmill database, their version, and the checks
``open`` and ``migrate`` make before using a database.

Every collection is created by :func:`create`, outside any transaction, and never by its
first write; the version is recorded in ``taskmill_meta``. A database that holds other
collections and no taskmill version is refused, never modified.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Final

from pymongo import ASCENDING, DESCENDING, IndexModel
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, CollectionInvalid, DuplicateKeyError, OperationFailure
from taskmill.errors import SchemaVersionError, StorageUnavailable

from taskmill_mongo.options import redact

__all__ = [
    "ATTEMPT_INDEXES",
    "COLLECTIONS",
    "DEPENDENCY_INDEXES",
    "DEPENDENTS",
    "EVENT_INDEXES",
    "EVENT_SHARDS",
    "SCHEMA_VERSION",
    "SHARDS",
    "TASK_INDEXES",
    "TOMBSTONE_INDEXES",
    "UNLOGGED",
    "WAITING",
    "Doc",
    "change_streams_offered",
    "check_version",
    "create",
    "create_counters",
    "stored_version",
]

Doc = dict[str, Any]

SCHEMA_VERSION: Final = 5
"""The version of the collections and indexes this code creates (``taskmill_meta``).

1. ``tasks``, ``attempts``, ``events``, ``counters``, ``suspensions``, ``handlers``.
2. Task dependencies (collection ``dependencies``; the task fields ``waiting_on`` and
   ``dependents``, absent when 0) and global limits (collection ``buckets``). Version 1
   data needs no rewrite: a task without the new fields waits for nothing and has no
   dependents, so ``migrate`` only creates the new indexes.

3. The event shards (:data:`SHARDS`): events numbered by one of 16 counters, keyed by
   a stamp, a shard and a position (:class:`~taskmill_mongo.documents.EventKey`), so that
   no single document serializes every writer (docs/backends/mongodb.md). No rewrite either: an
   event written before keeps its integer ``_id`` (its position in the ``events``
   counter, now shard 0) and is read before every later event; ``migrate`` creates the
   shard documents. The version makes a process of an older release refuse the database
   rather than number events from the ``events`` counter alone, which the others would
   read before their own.

4. Delete on complete (``Finish.delete``, docs/retention.md): collection
   ``tombstones``, the last document of each task a finish deleted (``_id`` the task
   id, so one per task; ``deleted_at``, indexed, for ``prune_events``), and the task
   field :data:`UNLOGGED`. No rewrite: ``migrate`` creates the collection and its
   index, here, outside any transaction (a finish's transaction must not be the one
   that creates it), and a task without the field has its attempt rows deleted. The
   version makes a process of an older release, which would read the events of a
   deleted task without its tombstone, refuse the database.

5. The worker registry (docs/workers.md): collection ``workers``, one document per
   registered worker (``_id`` the worker id, ``heartbeat_at`` the store clock at its
   last heartbeat in integer microseconds, ``record`` the core's JSON text). A handful
   of documents: no index but ``_id``. No rewrite: ``migrate`` creates the collection,
   and the version makes a process of an older release, which would neither heartbeat
   nor remove its registration, refuse the database.
"""

EVENT_SHARDS: Final = 16
"""How many counter documents events take their positions from: a transaction that
records events picks one at random, so concurrent writers rarely write the same one."""
SHARDS: Final = tuple("events" if k == 0 else f"events.{k}" for k in range(EVENT_SHARDS))
"""The ``counters`` documents of the event shards (``value``: positions taken,
``stamp``: the stamp of the newest events; see :mod:`taskmill_mongo.transactions`);
shard 0 is the ``events`` counter that numbered the log before it was sharded."""

COLLECTIONS: Final = (
    "tasks",
    "attempts",
    "events",
    "counters",
    "suspensions",
    "handlers",
    "dependencies",
    "buckets",
    "tombstones",
    "workers",
)
# The task fields a task document carries besides what task_document() writes (both
# absent when 0, so that a version-1 document reads as waiting for nothing):
# how many of its dependencies have not ended yet (a PENDING task with it is not
# claimable), and how many dependency edges name it (a hint that its end has dependents
# to settle, and the field an enqueue of a dependent writes to conflict with its end).
WAITING: Final = "waiting_on"
DEPENDENTS: Final = "dependents"
UNLOGGED: Final = "unlogged"
"""``true`` on a task document from its insertion to its first replacement (schema
version 4): no attempt row has been written for the task yet, as every transition that
logs an attempt (a finish, a rescue, a cancel of a RUNNING task) replaces the document,
which drops the field; a claim (``update_many``) keeps it. A deleting finish skips the
attempt delete of a task whose document still has it. Absent (a document inserted
before version 4, or by an older process): the rows are deleted."""

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
    # Unused since claims stopped writing claim tokens; kept so that every version-2
    # database has the same indexes.
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
# One document per task deleted by its finish (Finish.delete): ``deleted_at`` (the
# deleting transaction's time, integer microseconds) and the task's last document as
# JSON text (documents.tombstone). Its ``_id`` is the task id: the ``_id`` index is the
# unique index on the task id that the event reader (``_id $in``) and ``deleted_task``
# search; ``prune_events`` deletes by age on this one.
TOMBSTONE_INDEXES: Final = [IndexModel([("deleted_at", ASCENDING)], name="deleted_at")]


async def change_streams_offered(db: AsyncDatabase[Doc]) -> bool:
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


async def stored_version(db: AsyncDatabase[Doc], url: str) -> int | None:
    """The taskmill version recorded in ``db``, or None when it has none yet.

    :raises StorageUnavailable: ``db`` holds other collections and no taskmill version.
    """
    meta = await db.taskmill_meta.find_one({"_id": "schema"})
    if meta is None:
        names = set(await db.list_collection_names())
        if names - {"taskmill_meta", *COLLECTIONS}:
            raise StorageUnavailable(
                f"database {db.name!r} at {redact(url)} is not a taskmill "
                f"database (it holds {', '.join(sorted(names))}); name an empty or "
                "a taskmill database in the URL"
            )
        return None
    return int(meta["version"])


def check_version(version: int, database: str, url: str) -> None:
    """Refuse a stored ``version`` other than :data:`SCHEMA_VERSION`.

    :raises SchemaVersionError: naming the upgrade (newer) or the migration (older).
    """
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"database {database!r} has taskmill schema version {version}, newer "
            f"than this taskmill-mongo knows ({SCHEMA_VERSION}); upgrade it: "
            "pip install --upgrade taskmill-mongo"
        )
    if version < SCHEMA_VERSION:
        raise SchemaVersionError(
            f"database {database!r} has taskmill schema version {version}, older "
            f"than this code needs ({SCHEMA_VERSION}); run: "
            f"taskmill migrate --url {redact(url)}"
        )


async def create(db: AsyncDatabase[Doc]) -> None:
    """Create the collections' indexes (idempotent: the same definitions from
    several processes at once are one index) and record the version."""
    await db.tasks.create_indexes(TASK_INDEXES)
    await db.attempts.create_indexes(ATTEMPT_INDEXES)
    await db.events.create_indexes(EVENT_INDEXES)
    await db.dependencies.create_indexes(DEPENDENCY_INDEXES)
    await db.tombstones.create_indexes(TOMBSTONE_INDEXES)
    # Every collection is created here, outside any transaction, not by its first
    # write: ``suspensions`` and ``buckets`` are first written inside a
    # transaction (a suspend, a claim's rate-limit upsert), and creating a
    # collection there is refused by MongoDB before 4.4 and in cross-shard write
    # transactions, and raced in the MongoDB-protocol test server (a suspend
    # once failed there with "no such table: suspensions").
    existing = set(await db.list_collection_names())
    for name in COLLECTIONS:
        if name in existing:
            continue
        with contextlib.suppress(CollectionInvalid):  # created by another process
            try:
                await db.create_collection(name)
            except OperationFailure as exc:
                if exc.code != 48:  # NamespaceExists: created meanwhile
                    raise
    await create_counters(db, ("tasks", *SHARDS))
    # DuplicateKeyError: recorded (at this version or newer) by another process meanwhile.
    with contextlib.suppress(DuplicateKeyError):
        await db.taskmill_meta.update_one(
            {"_id": "schema", "version": {"$lt": SCHEMA_VERSION}},
            {"$set": {"version": SCHEMA_VERSION}},
            upsert=True,
        )


async def create_counters(db: AsyncDatabase[Doc], names: Sequence[str]) -> None:
    """Create the ``counters`` documents of ``names`` that do not exist yet, at 0, in
    one round trip (those another process created meanwhile are left as they are)."""
    existing = {d["_id"] async for d in db.counters.find({"_id": {"$in": list(names)}}, {"_id": 1})}
    missing = [{"_id": name, "value": 0} for name in names if name not in existing]
    if not missing:
        return
    try:
        await db.counters.insert_many(missing, ordered=False)
    except BulkWriteError as exc:
        if any(e.get("code") != 11000 for e in exc.details.get("writeErrors", [])):
            raise
