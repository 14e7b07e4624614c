"""Enqueue: inserting new tasks in one transaction, with the duplicate-id rule, dedupe
and dependencies.

- **Dedupe**: ``leader_key`` is set only while a task is an active leader, and a unique
  partial index on it admits one leader per key; an enqueue that loses that race (a
  duplicate-key error) runs again and then finds the leader.
- **Dependencies**: each dependency not ended yet gets an edge document and a
  ``dependents`` increment, fenced by the status read, so that the enqueue conflicts
  with the dependency's end and no release is lost; a dependency that already ended in
  a way that cancels the task cancels it at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from taskmill.lifecycle import (
    DEPENDENCY_CANCEL_REASON,
    DEPENDENCY_CANCELLATION,
    TERMINAL_EVENTS,
    check_dependencies,
    dependency_blocks,
    dependency_error,
    enqueued,
    settle_alias,
    settles_aliases,
    split_taken,
)
from taskmill.model import EventKind, Task, TaskStatus
from taskmill.serialization import dumps
from taskmill.storage import NewTask

from taskmill_mongo.connection import Connection
from taskmill_mongo.documents import from_micros, leader_key, task, task_document
from taskmill_mongo.queries import one_of
from taskmill_mongo.schema import DEPENDENTS, UNLOGGED, WAITING, Doc
from taskmill_mongo.settlement import DEPENDENCY_CANCEL_PLAN
from taskmill_mongo.transactions import Raced, Writes, record, reserve, transaction

__all__ = ["enqueue"]


async def enqueue(conn: Connection, tasks: Sequence[NewTask]) -> list[Task]:
    """Store ``tasks`` in one transaction (see :meth:`taskmill.storage.TaskStorage.enqueue`);
    the snapshot of each, in the order given."""

    async def body(s: AsyncClientSession) -> list[Task]:
        db = conn.database()
        now = await conn.now()
        at = from_micros(now)
        # The duplicate-id rule (lifecycle.split_taken): ids already stored are
        # returned as they are; an id inserted concurrently makes the insert fail on
        # _id and the transaction run again, finding it here.
        ids = list(dict.fromkeys(new.id for new in tasks))
        taken = {
            doc["_id"]: task(doc) async for doc in db.tasks.find({"_id": {"$in": ids}}, session=s)
        }
        fresh, known = split_taken(tasks, taken)
        dependencies = await _dependencies(db, s, fresh)
        first = await reserve(db, s, "tasks", len(fresh))
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
                {"leader_key": one_of(sorted(keys))}, {"leader_key": 1}, session=s
            ):
                leaders[doc["leader_key"]] = doc["_id"]
        stored: list[Task] = []
        docs: list[Doc] = []
        edges: list[Doc] = []
        new_edges: dict[str, int] = {}  # dependency id -> edges this call adds
        writes = Writes()
        blocked_leaders: dict[str, Task] = {}  # leaders of this batch cancelled at once
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
            if alias_of in blocked_leaders:
                # Its leader of this batch is cancelled at once: it follows it, as the
                # batch stored then its blocked tasks cancelled in order would have it.
                t = settle_alias(t, blocked_leaders[alias_of], at)
                writes.emit(TERMINAL_EVENTS[t.status], t)
            elif blocker is not None:
                t = DEPENDENCY_CANCEL_PLAN.apply(
                    t,
                    at,
                    error=dependency_error(*blocker),
                    cancel_reason=DEPENDENCY_CANCEL_REASON,
                )
                writes.emit(DEPENDENCY_CANCELLATION.event, t)
                if settles_aliases(t.status, t.dedupe_key, t.alias_of):
                    blocked_leaders[t.id] = t
            stored.append(t)
            doc = task_document(t, first + i)
            doc[UNLOGGED] = True
            if waiting:
                doc[WAITING] = waiting
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
                {"$inc": {DEPENDENTS: count}},
                session=s,
            )
            if result.matched_count != 1:
                raise Raced
        await record(db, s, writes, now)
        known.update((t.id, t) for t in stored)
        return [known[new.id] for new in tasks]

    return await transaction(conn, body)


async def _dependencies(
    db: AsyncDatabase[Doc], s: AsyncClientSession, fresh: Sequence[NewTask]
) -> dict[str, Doc]:
    """The (status, app id) documents of every task ``fresh`` depends on; refuses a
    dependency that is not stored or is another app's (before anything is written)."""
    wanted = list(dict.fromkeys(d for new in fresh for d in new.after))
    if not wanted:
        return {}
    found = {
        d["_id"]: d
        async for d in db.tasks.find(
            {"_id": {"$in": wanted}}, {"status": 1, "app_id": 1}, session=s
        )
    }
    check_dependencies(fresh, {task_id: doc["app_id"] for task_id, doc in found.items()})
    return found
