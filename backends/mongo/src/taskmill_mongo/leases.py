"""The writes of a lease holder and the rescue of expired leases: finishing attempts,
renewing and watching leases, saving progress, and ending or retrying the tasks whose
lease lapsed.

A lease holds while its task is RUNNING with the lease's worker id and attempt number;
each write here is fenced by that, and a lease that no longer holds is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from pymongo import ASCENDING
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from taskmill.lifecycle import (
    FINISHES,
    RESCUE_ERROR,
    RESCUES,
    finish_kind,
    finish_values,
    plan,
    rescue_case,
)
from taskmill.model import (
    Attempt,
    AttemptOutcome,
    CancelReason,
    EventKind,
    SuspensionScope,
    Task,
)
from taskmill.storage import LEASE_FENCE, LEASED_STATUS, Finish, Lease, ProgressUpdate

from taskmill_mongo.connection import Connection
from taskmill_mongo.documents import from_micros, task, task_document
from taskmill_mongo.queries import RUNNING, eq
from taskmill_mongo.schema import UNLOGGED, Doc
from taskmill_mongo.settlement import settle
from taskmill_mongo.transactions import Nothing, Writes, read, record, replace, transaction

__all__ = ["check_leases", "finish_batch", "rescue_expired", "save_progress"]

_FINISH_PLANS: Final = {kind: plan(t) for kind, t in FINISHES.items()}
_RESCUE_PLANS: Final = {case: plan(t) for case, t in RESCUES.items()}


def _fence(lease: Lease) -> Doc:
    """The query of :data:`~taskmill.storage.LEASE_FENCE` for ``lease``."""
    values = iter(lease.fence_args())
    return {
        "_id" if name == "id" else name: LEASED_STATUS if attribute is None else next(values)
        for name, attribute in LEASE_FENCE
    }


def _holds(lease: Lease, doc: Doc) -> bool:
    return lease.holds(doc["_id"], doc["status"], doc["worker_id"], doc["attempts"])


async def _held(
    db: AsyncDatabase[Doc], s: AsyncClientSession, leases: Iterable[Lease]
) -> dict[str, Doc]:
    """The documents of the tasks whose ``leases`` still hold, by task id."""
    wanted = {lease.task_id: lease for lease in leases}
    found: dict[str, Doc] = {}
    async for doc in db.tasks.find({"_id": {"$in": list(wanted)}}, session=s):
        if _holds(wanted[doc["_id"]], doc):
            found[doc["_id"]] = doc
    return found


async def finish_batch(conn: Connection, finishes: Sequence[Finish]) -> list[Task | None]:
    """Write ``finishes`` (not empty) in one transaction (see
    :meth:`taskmill.storage.TaskStorage.finish_batch`): the new snapshot of each, or
    None where its lease no longer held."""

    async def body(s: AsyncClientSession) -> list[Task | None]:
        db = conn.database()
        now = await conn.now()
        held = await _held(db, s, (f.lease for f in finishes))
        writes = Writes(replacements=[])  # the finishes' writes go as one bulk_write
        results: list[Task | None] = []
        for finish in finishes:
            doc = held.get(finish.lease.task_id)
            if doc is None or not _holds(finish.lease, doc):
                results.append(None)
                continue
            kind = finish.kind
            if doc["cancel_reason"] is not None:
                kind = finish_kind(kind, stop_requested=True)
            chosen = _FINISH_PLANS[kind]
            values = finish_values(finish, kind, from_micros(now))
            new = await settle(db, s, doc, chosen, now, writes, delete=finish.delete, **values)
            del held[new.id]
            results.append(new)
            if writes.forgotten and new.id in writes.forgotten:
                # Deleted with its log: this attempt is not logged, and a task whose
                # document still says it has no log needs no delete of it.
                if doc.get(UNLOGGED):
                    writes.unlogged.add(new.id)
                continue
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
        if not writes.events:
            raise Nothing(results)
        await record(db, s, writes, now)
        return results

    return await transaction(conn, body)


async def check_leases(
    conn: Connection, leases: Sequence[Lease], lease_seconds: float | None
) -> dict[str, CancelReason | None]:
    """For each of ``leases`` (not empty) that still holds, why its task should stop
    (None: it should not); with ``lease_seconds``, those leases are renewed first.

    Two round trips on MongoDB (one without a renewal): the fenced ``update_many``,
    then one aggregation that reads the leased tasks and, through ``$unionWith``, the
    suspensions. With ``serialize_writes`` the tasks and the suspensions are two finds:
    nx-27017 (the test stand-in) runs an aggregation's ``$match`` in Python over the
    whole collection."""
    ids = list(dict.fromkeys(lease.task_id for lease in leases))
    by_id: dict[str, list[Lease]] = {}
    for lease in leases:
        by_id.setdefault(lease.task_id, []).append(lease)

    async def run() -> dict[str, CancelReason | None]:
        db = conn.database()
        if lease_seconds is not None:
            until = await conn.now() + int(lease_seconds * 1_000_000)
            # Searched on _id, the fences then checked on those documents (the
            # stand-in scans the collection for an $or alone).
            await db.tasks.update_many(
                {"_id": {"$in": ids}, "$or": [_fence(lease) for lease in leases]},
                {"$set": {"lease_expires_at": until}},
            )
        if conn.options.serialize_writes:
            tasks, suspended = await _leased_apart(db, ids)
        else:
            tasks, suspended = await _leased_together(db, ids)
        answer: dict[str, CancelReason | None] = {}
        for doc in tasks:
            if not any(_holds(lease, doc) for lease in by_id[doc["_id"]]):
                continue
            reason = doc["cancel_reason"]
            if reason is not None:
                answer[doc["_id"]] = CancelReason(reason)
            elif any(sc.covers(doc["app_id"], doc["task_type"]) for sc in suspended):
                answer[doc["_id"]] = CancelReason.SUSPENDED
            else:
                answer[doc["_id"]] = None
        return answer

    return await read(conn, run())


_LEASED: Final = {
    "status": 1,
    "worker_id": 1,
    "attempts": 1,
    "cancel_reason": 1,
    "app_id": 1,
    "task_type": 1,
}
"""The fields of a leased task that a lease check reads: its fence and why it stops."""


async def _leased_together(
    db: AsyncDatabase[Doc], ids: list[str]
) -> tuple[list[Doc], list[SuspensionScope]]:
    """The leased tasks and the suspensions, in one aggregation."""
    marked: Doc = {"_id": 0, "suspension": {"$literal": True}, "task_type": 1, "app_id": 1}
    pipeline: list[Doc] = [
        {"$match": {"_id": {"$in": ids}}},
        {"$project": _LEASED},
        {"$unionWith": {"coll": "suspensions", "pipeline": [{"$project": marked}]}},
    ]
    tasks: list[Doc] = []
    suspended: list[SuspensionScope] = []
    async for doc in await db.tasks.aggregate(pipeline):
        if doc.get("suspension") is True:
            suspended.append(SuspensionScope(task_type=doc["task_type"], app_id=doc["app_id"]))
        else:
            tasks.append(doc)
    return tasks, suspended


async def _leased_apart(
    db: AsyncDatabase[Doc], ids: list[str]
) -> tuple[list[Doc], list[SuspensionScope]]:
    """The leased tasks, then (when any is found) the suspensions: two finds. By
    ``_id $in`` alone: with the fences' ``$or`` the stand-in filters every document of
    the collection in Python (3-9 s a check at 200,000 finished tasks)."""
    tasks = await db.tasks.find({"_id": {"$in": ids}}, _LEASED).to_list()
    suspended = (
        [
            SuspensionScope(task_type=d["task_type"], app_id=d["app_id"])
            async for d in db.suspensions.find({})
        ]
        if tasks
        else []
    )
    return tasks, suspended


async def save_progress(conn: Connection, updates: Sequence[ProgressUpdate]) -> set[str]:
    """Write ``updates`` (not empty) in one transaction; the ids of the tasks whose
    lease still held (the ones written)."""

    async def body(s: AsyncClientSession) -> set[str]:
        db = conn.database()
        now = await conn.now()
        at = from_micros(now)
        held = await _held(db, s, (u.lease for u in updates))
        writes = Writes(replacements=[])
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
            await replace(db, s, doc, new, writes)
            held[new.id] = task_document(new, doc["seq"])
            writes.emit(EventKind.PROGRESS, new)
            written.add(new.id)
        if not written:
            raise Nothing(written)
        await record(db, s, writes, now)
        return written

    return await transaction(conn, body)


async def rescue_expired(conn: Connection, limit: int) -> list[Task]:
    """End or retry, in one transaction, up to ``limit`` (positive) RUNNING tasks whose
    lease expired, oldest first, as :data:`taskmill.lifecycle.RESCUES` says."""

    async def body(s: AsyncClientSession) -> list[Task]:
        db = conn.database()
        now = await conn.now()
        at = from_micros(now)
        expired = (
            await db.tasks.find(
                {"status": eq(RUNNING), "lease_expires_at": {"$lte": now}}, session=s
            )
            .sort("seq", ASCENDING)
            .hint("lease")
            .limit(max(limit, 0))
            .to_list()
        )
        if not expired:
            raise Nothing([])
        writes = Writes(replacements=[])
        rescued: list[Task] = []
        for doc in expired:
            old = task(doc)
            chosen = _RESCUE_PLANS[rescue_case(old.cancel_reason, old.attempts, old.max_retries)]
            new = await settle(db, s, doc, chosen, now, writes, error=RESCUE_ERROR)
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
        await record(db, s, writes, now)
        return rescued

    return await transaction(conn, body)
