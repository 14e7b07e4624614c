"""The consequences of a transition, inside the transaction that writes it: its event,
and when the task ends, the settlement of its aliases (when it is a dedupe leader) and
then, breadth first, of the dependents of it and of those aliases.

**Dependencies** (``after=``): one ``dependencies`` document per unresolved edge; the
dependent carries ``waiting_on`` (claims take only tasks without it) and each dependency
``dependents``, which the enqueue of a dependent ``$inc``s so that it write-conflicts
with the dependency's end. The decisions are the lifecycle kernel's
(:func:`~taskmill.lifecycle.settle_alias`, :func:`~taskmill.lifecycle.dependency_settles`).
"""

from __future__ import annotations

from typing import Any, Final

from pymongo import ASCENDING
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from taskmill.lifecycle import (
    DEPENDENCY_CANCEL_REASON,
    DEPENDENCY_CANCELLATION,
    TERMINAL_EVENTS,
    DependentOutcome,
    TransitionPlan,
    dependency_blocks,
    dependency_error,
    dependency_settles,
    plan,
    settle_alias,
    settles_aliases,
)
from taskmill.model import EventKind, Task, TaskStatus

from taskmill_mongo.documents import from_micros, task
from taskmill_mongo.queries import PENDING, eq, one_of
from taskmill_mongo.schema import DEPENDENTS, WAITING, Doc
from taskmill_mongo.transactions import Raced, Writes, flush, replace

__all__ = ["DEPENDENCY_CANCEL_PLAN", "resolve", "settle"]

DEPENDENCY_CANCEL_PLAN: Final = plan(DEPENDENCY_CANCELLATION)


async def settle(
    db: AsyncDatabase[Doc],
    s: AsyncClientSession,
    doc: Doc,
    chosen: TransitionPlan,
    now: int,
    writes: Writes,
    **values: Any,
) -> Task:
    """Write a transition of ``doc``'s task and its consequences: the event, and,
    when it reaches a terminal status, the settlement of its aliases (when it is a
    leader) and then of the dependents of it and of those aliases."""
    at = from_micros(now)
    new = chosen.apply(task(doc), at, **values)
    await replace(db, s, doc, new, writes)
    writes.emit(chosen.transition.event, new)
    if not new.status.terminal:
        return new
    ended: list[tuple[str, TaskStatus]] = []
    if doc.get(DEPENDENTS):
        ended.append((new.id, new.status))
    if settles_aliases(new.status, new.dedupe_key, new.alias_of):
        await flush(db, s, writes)  # the reads below see what this wrote
        kind = TERMINAL_EVENTS[new.status]
        cursor = (
            db.tasks.find({"alias_of": eq(new.id), "status": eq(PENDING)}, session=s)
            .sort("seq", ASCENDING)
            .hint("aliases")
        )
        async for alias_doc in cursor:
            alias = settle_alias(task(alias_doc), new, at)
            await replace(db, s, alias_doc, alias, writes)
            writes.emit(kind, alias)
            writes.settled_aliases.append(alias)
            if alias_doc.get(DEPENDENTS):
                ended.append((alias.id, alias.status))
    if ended:
        await flush(db, s, writes)
        await resolve(db, s, ended, now, writes)
    return new


async def resolve(
    db: AsyncDatabase[Doc],
    s: AsyncClientSession,
    ended: list[tuple[str, TaskStatus]],
    now: int,
    writes: Writes,
) -> None:
    """Settle the dependents of the tasks that just ended (id, terminal status) as
    :func:`taskmill.lifecycle.dependency_settles` says, and in turn, breadth first,
    those of the dependents that cancels; each edge is resolved once (deleted)."""
    at = from_micros(now)
    level = ended
    while level:
        status_of = dict(level)
        level = []
        edges = await db.dependencies.find(
            {"depends_on": one_of(list(status_of))}, session=s
        ).to_list()
        if not edges:
            break
        await db.dependencies.delete_many({"_id": {"$in": [e["_id"] for e in edges]}}, session=s)
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
            waiting = int(doc.get(WAITING) or 0)
            left = max(waiting - 1, 0)
            if waiting:
                change = {"$set": {WAITING: left}} if left else {"$unset": {WAITING: ""}}
                result = await db.tasks.update_one(
                    {"_id": doc["_id"], WAITING: waiting}, change, session=s
                )
                if result.matched_count != 1:
                    raise Raced
                doc = {k: v for k, v in doc.items() if k != WAITING}
                if left:
                    doc[WAITING] = left
                docs[doc["_id"]] = doc
            ended_as = status_of[edge["depends_on"]]
            blocks = bool(dependency_blocks(ended_as, bool(edge["always"])))
            outcome = dependency_settles(TaskStatus(doc["status"]), left, blocks=blocks)
            if outcome is DependentOutcome.RELEASED:
                writes.emit(EventKind.RELEASED, task(doc))
            elif outcome is DependentOutcome.CANCELLED:
                new = DEPENDENCY_CANCEL_PLAN.apply(
                    task(doc),
                    at,
                    error=dependency_error(edge["depends_on"], ended_as),
                    cancel_reason=DEPENDENCY_CANCEL_REASON,
                )
                docs[doc["_id"]] = await replace(db, s, doc, new)
                writes.emit(DEPENDENCY_CANCELLATION.event, new)
                writes.dependents_cancelled.append(new)
                if doc.get(DEPENDENTS):
                    level.append((new.id, new.status))
