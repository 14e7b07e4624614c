"""A cancel, inside the transaction that runs it: which tasks it selects, asking running
ones to stop (a non-terminal reason), or ending them CANCELLED with their aliases and
dependents settled (a terminal one); and a suspension, which asks the running tasks it
covers to stop in the transaction that writes it.

The decisions are the lifecycle kernel's (:func:`~taskmill.lifecycle.cancel_targets`,
:func:`~taskmill.lifecycle.cancel_error`), the sequence the settlement engine's
(:func:`taskmill.settlement.cancel`) over :class:`~taskmill_mongo.settlement.MongoLedger`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pymongo import ASCENDING
from pymongo.asynchronous.client_session import AsyncClientSession
from taskmill.lifecycle import cancel_targets
from taskmill.model import CancelReason, SuspensionScope, Task, TaskFilter
from taskmill.settlement import cancel as settlement_cancel

from taskmill_mongo.connection import Connection
from taskmill_mongo.documents import from_micros, task
from taskmill_mongo.queries import ACTIVE, RUNNING, filter_query, one_of, scope_id
from taskmill_mongo.schema import Doc
from taskmill_mongo.settlement import MongoLedger
from taskmill_mongo.transactions import Nothing, Writes, record

__all__ = ["cancel_in", "suspend_in"]


async def cancel_in(
    conn: Connection,
    s: AsyncClientSession,
    task_ids: Sequence[str] | None,
    filter: TaskFilter | None,
    reason: CancelReason,
    cascade: bool,
) -> list[Task]:
    """``cancel`` inside transaction ``s`` (see :meth:`taskmill.storage.TaskStorage.cancel`).

    :returns: every changed task: the selection and its descendants in that order,
        each cancelled leader followed by its aliases, then the dependents it cancelled.
    :raises Nothing: nothing changed (the transaction ends with an empty list).
    """
    db = conn.database()
    now = await conn.now()
    at = from_micros(now)
    selected = list(task_ids or ())
    if filter is not None:
        query = filter_query(filter)
        active = {"status": {"$in": ACTIVE}}
        query = {"$and": [query, active]} if query else active
        selected.extend(
            [d["_id"] async for d in db.tasks.find(query, {"_id": 1}, session=s).sort("seq", 1)]
        )

    async def children_of(level: list[str]) -> list[tuple[str, str]]:
        cursor = db.tasks.find(
            {"parent_id": one_of(level)}, {"_id": 1, "parent_id": 1}, session=s
        ).sort("seq", ASCENDING)
        return [(d["_id"], d["parent_id"]) async for d in cursor]

    targets = await cancel_targets(selected, children_of if cascade else None)
    writes = Writes()
    changed = await settlement_cancel(MongoLedger(db, s, now, writes), targets, reason, at)
    if not changed:
        raise Nothing([])
    await record(db, s, writes, now)
    return [task(doc) for doc in changed]


async def suspend_in(conn: Connection, s: AsyncClientSession, scope: SuspensionScope) -> int:
    """Write the suspension of ``scope`` inside transaction ``s`` and ask the RUNNING
    tasks it covers to stop; how many were asked."""
    db = conn.database()
    await db.suspensions.replace_one(
        {"_id": scope_id(scope)},
        {"_id": scope_id(scope), "task_type": scope.task_type, "app_id": scope.app_id},
        upsert=True,
        session=s,
    )
    query: Doc = {"status": RUNNING}
    if scope.task_type is not None:
        query["task_type"] = scope.task_type
    if scope.app_id is not None:
        query["app_id"] = scope.app_id
    running = [d["_id"] async for d in db.tasks.find(query, {"_id": 1}, session=s)]
    if not running:
        return 0
    try:
        changed = await cancel_in(conn, s, running, None, CancelReason.SUSPENDED, False)
    except Nothing:
        return 0  # the suspension itself is written: commit it
    return len(changed)
