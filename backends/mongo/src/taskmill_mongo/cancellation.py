"""A cancel, inside the transaction that runs it: which tasks it selects, asking running
ones to stop (a non-terminal reason), or ending them CANCELLED with their aliases and
dependents settled (a terminal one); and a suspension, which asks the running tasks it
covers to stop in the transaction that writes it.

The decisions are the lifecycle kernel's (:func:`~taskmill.lifecycle.cancel_targets`,
:func:`~taskmill.lifecycle.cancel_error`); the consequences are
:func:`~taskmill_mongo.settlement.settle`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from pymongo import ASCENDING
from pymongo.asynchronous.client_session import AsyncClientSession
from taskmill.lifecycle import CANCELLATION, cancel_error, cancel_targets, plan
from taskmill.model import (
    Attempt,
    CancelReason,
    EventKind,
    SuspensionScope,
    Task,
    TaskFilter,
    TaskStatus,
)

from taskmill_mongo.connection import Connection
from taskmill_mongo.documents import from_micros, task
from taskmill_mongo.queries import ACTIVE, RUNNING, filter_query, one_of, scope_id
from taskmill_mongo.schema import Doc
from taskmill_mongo.settlement import settle
from taskmill_mongo.transactions import Nothing, Writes, record, replace

__all__ = ["cancel_in", "suspend_in"]

assert CANCELLATION.outcome is not None
_CANCELLED_OUTCOME: Final = CANCELLATION.outcome
_CANCEL_PLAN: Final = plan(CANCELLATION)


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
    changed: list[Task] = []
    settled: set[str] = set()
    for task_id in targets:
        if task_id in settled:
            continue
        doc = await db.tasks.find_one({"_id": task_id}, session=s)
        if doc is None or doc["status"] not in ACTIVE:
            continue
        old = task(doc)
        if not reason.terminal:
            if old.status is TaskStatus.RUNNING and old.cancel_reason is None:
                new = old.evolve(cancel_reason=reason, updated_at=at)
                await replace(db, s, doc, new)
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
        new = await settle(db, s, doc, _CANCEL_PLAN, now, writes, cancel_reason=reason)
        changed.append(new)
        for alias in writes.settled_aliases[aliases:]:
            settled.add(alias.id)
            changed.append(alias)
        changed += writes.dependents_cancelled[dependents:]
    if not changed:
        raise Nothing(changed)
    await record(db, s, writes, now)
    return changed


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
