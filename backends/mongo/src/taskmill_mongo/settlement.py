"""The MongoDB side of the settlement engine (:mod:`taskmill.settlement`): the reads and
fenced writes of one transaction that the engine sequences when tasks end (their
aliases, their dependents) and when a cancel runs.

**Dependencies** (``after=``): one ``dependencies`` document per unresolved edge; the
dependent carries ``waiting_on`` (claims take only tasks without it) and each dependency
``dependents``, which the enqueue of a dependent ``$inc``s so that it write-conflicts
with the dependency's end. A task that ends without ``dependents`` has no edge to
resolve, so the ledger looks edges up only for tasks that had some.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from pymongo import ASCENDING
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from taskmill.lifecycle import (
    CANCELLATION,
    DEPENDENCY_CANCEL_REASON,
    DEPENDENCY_CANCELLATION,
    TransitionPlan,
    plan,
    settle_alias,
    settles_aliases,
)
from taskmill.model import Attempt, CancelReason, EventKind, Task, TaskStatus
from taskmill.settlement import Active, Edge, Settlement

from taskmill_mongo.documents import from_micros, task
from taskmill_mongo.queries import ACTIVE, PENDING, RUNNING, eq, one_of
from taskmill_mongo.schema import DEPENDENTS, WAITING, Doc
from taskmill_mongo.transactions import Raced, Writes, flush, replace

__all__ = ["DEPENDENCY_CANCEL_PLAN", "MongoLedger", "settle"]

DEPENDENCY_CANCEL_PLAN: Final = plan(DEPENDENCY_CANCELLATION)
_CANCEL_PLAN: Final = plan(CANCELLATION)


class MongoLedger:
    """:class:`taskmill.settlement.CancelLedger` over transaction ``s`` at ``now``
    (integer microseconds); events and attempt log rows go to ``writes``, recorded by
    :func:`~taskmill_mongo.transactions.record`."""

    __slots__ = ("_active", "_at", "_db", "_dependents", "_docs", "_now", "_s", "writes")

    def __init__(
        self, db: AsyncDatabase[Doc], s: AsyncClientSession, now: int, writes: Writes
    ) -> None:
        self._db = db
        self._s = s
        self._now = now
        self._at = from_micros(now)
        self.writes = writes
        self._dependents: set[str] = set()  # ended tasks that had dependents
        self._docs: dict[str, Doc] = {}  # dependents read by resolve_edges, by id
        self._active: dict[str, Doc] = {}  # read by lock_active, by id

    async def write(self, old: Doc, new: Task) -> Doc:
        """Write the transition of ``old``'s task to ``new`` (fenced: see
        :func:`~taskmill_mongo.transactions.replace`); the document written."""
        if old.get(DEPENDENTS):
            self._dependents.add(old["_id"])
        return await replace(self._db, self._s, old, new, self.writes)

    def identify(self, row: Doc) -> tuple[str, TaskStatus]:
        return row["_id"], TaskStatus(row["status"])

    def leads_aliases(self, row: Doc) -> bool:
        return settles_aliases(TaskStatus(row["status"]), row["dedupe_key"], row["alias_of"])

    def emit(self, kind: EventKind, row: Doc) -> None:
        self.writes.events.append((kind, row["_id"], TaskStatus(row["status"])))

    async def settle_aliases(self, leader: Doc) -> list[Doc]:
        db, s = self._db, self._s
        await flush(db, s, self.writes)  # the reads below see what this wrote
        cursor = (
            db.tasks.find({"alias_of": eq(leader["_id"]), "status": eq(PENDING)}, session=s)
            .sort("seq", ASCENDING)
            .hint("aliases")
        )
        settled: list[Doc] = []
        lead = task(leader)
        async for alias_doc in cursor:
            settled.append(
                await self.write(alias_doc, settle_alias(task(alias_doc), lead, self._at))
            )
        return settled

    async def resolve_edges(self, ended: Sequence[str]) -> list[Edge]:
        wanted = [i for i in ended if i in self._dependents]
        if not wanted:
            return []
        db, s = self._db, self._s
        await flush(db, s, self.writes)
        edges = await db.dependencies.find({"depends_on": one_of(wanted)}, session=s).to_list()
        if not edges:
            return []
        await db.dependencies.delete_many({"_id": {"$in": [e["_id"] for e in edges]}}, session=s)
        ids = sorted({e["task_id"] for e in edges})
        self._docs.update(
            {d["_id"]: d async for d in db.tasks.find({"_id": {"$in": ids}}, session=s)}
        )
        # In the dependents' creation order (the reference store's), deleted ones last.
        docs = self._docs
        edges.sort(
            key=lambda e: (
                docs[e["task_id"]]["seq"] if e["task_id"] in docs else -1,
                e["depends_on"],
            )
        )
        return [Edge(e["depends_on"], e["task_id"], bool(e["always"])) for e in edges]

    async def count_down(self, dependent: str) -> tuple[Doc, int] | None:
        doc = self._docs.get(dependent)
        if doc is None:
            return None  # removed by cleanup
        waiting = int(doc.get(WAITING) or 0)
        left = max(waiting - 1, 0)
        if waiting:
            change = {"$set": {WAITING: left}} if left else {"$unset": {WAITING: ""}}
            result = await self._db.tasks.update_one(
                {"_id": dependent, WAITING: waiting}, change, session=self._s
            )
            if result.matched_count != 1:
                raise Raced
            doc = {k: v for k, v in doc.items() if k != WAITING}
            if left:
                doc[WAITING] = left
            self._docs[dependent] = doc
        return doc, left

    async def cancel_dependent(self, dependent: Doc, error: str) -> Doc:
        new = DEPENDENCY_CANCEL_PLAN.apply(
            task(dependent), self._at, error=error, cancel_reason=DEPENDENCY_CANCEL_REASON
        )
        if dependent.get(DEPENDENTS):
            self._dependents.add(dependent["_id"])
        written = await replace(self._db, self._s, dependent, new)
        self._docs[dependent["_id"]] = written
        return written

    async def request_stop(self, ids: Sequence[str], reason: CancelReason) -> dict[str, Doc]:
        query: Doc = {"_id": {"$in": list(ids)}, "status": RUNNING, "cancel_reason": None}
        asked: dict[str, Doc] = {}
        async for doc in self._db.tasks.find(query, session=self._s):
            new = task(doc).evolve(cancel_reason=reason, updated_at=self._at)
            asked[doc["_id"]] = await self.write(doc, new)
        return asked

    async def lock_active(self, ids: Sequence[str]) -> list[Active]:
        # Read here, written fenced by this state: a concurrent change of one of them
        # makes its write miss and the transaction run again.
        query: Doc = {"_id": {"$in": list(ids)}, "status": {"$in": ACTIVE}}
        found = await self._db.tasks.find(query, session=self._s).sort("seq", ASCENDING).to_list()
        active: list[Active] = []
        for doc in found:
            self._active[doc["_id"]] = doc
            t = task(doc)
            active.append(Active(t.id, t.status, t.alias_of, t.worker_id, t.attempts, t.started_at))
        return active

    async def cancel_rows(self, ids: Sequence[str], reason: CancelReason) -> dict[str, Doc]:
        cancelled: dict[str, Doc] = {}
        for task_id in ids:
            doc = self._active[task_id]
            new = _CANCEL_PLAN.apply(task(doc), self._at, cancel_reason=reason)
            cancelled[task_id] = await self.write(doc, new)
        return cancelled

    async def log_attempts(self, attempts: Sequence[Attempt]) -> None:
        self.writes.attempts += attempts

    async def forget(self, rows: Sequence[Doc]) -> None:
        """:class:`taskmill.settlement.Forgets`: the ended tasks ``rows`` go to
        ``writes``, which :func:`~taskmill_mongo.transactions.record` deletes (with their
        attempt rows) and keeps as tombstones, for the whole batch at once."""
        forgotten = self.writes.forgotten
        for row in rows:
            forgotten[row["_id"]] = row


async def settle(
    db: AsyncDatabase[Doc],
    s: AsyncClientSession,
    doc: Doc,
    chosen: TransitionPlan,
    now: int,
    writes: Writes,
    *,
    delete: bool = False,
    **values: Any,
) -> Task:
    """Write a transition of ``doc``'s task and, through the settlement engine, its
    consequences: the event, and, when it reaches a terminal status, the settlement of
    its aliases (when it is a leader) and then of the dependents of it and of those
    aliases. ``delete`` (``Finish.delete``): when it ends COMPLETED or FAILED, the task
    and the aliases it settled then go to ``writes.forgotten``."""
    ledger = MongoLedger(db, s, now, writes)
    new = chosen.apply(task(doc), from_micros(now), **values)
    settlement = Settlement(ledger)
    written = await ledger.write(doc, new)
    await settlement.transitioned(written, chosen.transition.event, delete=delete)
    if settlement.pending:
        await settlement.dependents()
    return new
