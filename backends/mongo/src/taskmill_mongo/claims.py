"""Claims: picking PENDING tasks and stamping them RUNNING in one transaction, under
the request's caps, the suspensions and the global limits.

- Candidate documents are read in claim order (priority DESC, insertion ASC) from the
  claim index, picked in Python with the host/app handler rule, the caps and the
  suspensions, then stamped RUNNING with one ``update_many``; the claimed tasks are the
  documents read with that stamp applied, with no read-back. A concurrent claim of a
  pick aborts one of the two transactions on MongoDB (a write conflict) and cannot
  happen under ``serialize_writes``; an ``update_many`` that stamped fewer than the picks
  anyway runs the claim again (:class:`~taskmill_mongo.transactions.Raced`).
- **Global limits**: a claim first writes the ``buckets`` document of each limited key
  (so two claims of one key conflict, as a row lock would serialize them), then reads
  its tokens, counts the key's RUNNING tasks and cuts its caps, all inside the claim's
  transaction: the sequence is :mod:`taskmill.limiting`'s, over :class:`MongoBuckets`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pymongo import ASCENDING, DESCENDING, ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from taskmill.limiting import limit_claim, spend_claimed
from taskmill.limits import Bucket, scope_of
from taskmill.model import EventKind, SuspensionScope, Task
from taskmill.serialization import dumps
from taskmill.storage import ClaimRequest, HandlerKey

from taskmill_mongo.connection import Connection
from taskmill_mongo.documents import task
from taskmill_mongo.queries import PENDING, RUNNING, eq, one_of
from taskmill_mongo.schema import WAITING, Doc
from taskmill_mongo.transactions import Nothing, Raced, Writes, record, transaction

__all__ = ["claim_batch"]


async def claim_batch(conn: Connection, request: ClaimRequest, types: Sequence[str]) -> list[Task]:
    """Claim up to ``request.limit`` tasks of ``types`` (the request's task types, not
    empty) in one transaction (see :meth:`taskmill.storage.TaskStorage.claim_batch`)."""

    async def body(s: AsyncClientSession) -> list[Task]:
        db = conn.database()
        now = await conn.now()
        buckets = MongoBuckets(db, s, now, split=conn.options.serialize_writes)
        limited = await limit_claim(buckets, request)
        handlers = limited.request.handlers
        if request.limits and not any(cap != 0 for cap in handlers.values()):
            raise Nothing([])
        suspended = [
            SuspensionScope(task_type=d["task_type"], app_id=d["app_id"])
            async for d in db.suspensions.find({}, session=s)
        ]
        # Planned on the claim index, whatever the history holds: ``alias_of: None``
        # also matches every finished task, so a planner must not pick ``aliases``.
        query: Doc = {
            "status": eq(PENDING),
            "task_type": one_of(types),
            "alias_of": None,
            WAITING: None,  # waits for no dependency (the field is absent)
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
            raise Nothing([])
        stamp: Doc = {
            "status": RUNNING,
            "worker_id": request.worker_id,
            "started_at": now,
            "updated_at": now,
            "lease_expires_at": now + int(request.lease_seconds * 1_000_000),
        }
        result = await db.tasks.update_many(
            {"_id": {"$in": [d["_id"] for d in picked]}, "status": PENDING, WAITING: None},
            {"$set": stamp, "$inc": {"attempts": 1}},
            session=s,
        )
        if result.modified_count != len(picked):
            raise Raced  # another claim took a pick since it was read
        # What the update wrote, applied to what was read.
        claimed = [task({**d, **stamp, "attempts": d["attempts"] + 1}) for d in picked]
        await spend_claimed(buckets, limited, ((t.app_id, t.task_type) for t in claimed))
        writes = Writes()
        for t in claimed:
            writes.emit(EventKind.STARTED, t)
        await record(db, s, writes, now)
        return claimed

    return await transaction(conn, body)


class MongoBuckets:
    """:class:`taskmill.limiting.BucketLedger` inside claim transaction ``s`` at ``now``
    (integer microseconds).

    Each limited key's bucket document (created empty when missing) is *written* first
    (``$inc`` of ``claims``), in :func:`~taskmill.limits.locked_keys` order: two claims
    of one key both write it, so on MongoDB they cannot both commit from the same
    snapshot (the second aborts with a write conflict and runs again on the new state).
    That is what makes the tokens read and the RUNNING tasks counted here hold when this
    claim commits, in the role MySQL's ``FOR UPDATE`` on the bucket row plays."""

    __slots__ = ("_db", "_now", "_s", "_split")

    def __init__(
        self, db: AsyncDatabase[Doc], s: AsyncClientSession, now: int, *, split: bool
    ) -> None:
        self._db = db
        self._s = s
        self._now = now
        self._split = split

    async def lock_buckets(
        self, keys: Sequence[HandlerKey]
    ) -> tuple[dict[HandlerKey, Bucket], float]:
        buckets: dict[HandlerKey, Bucket] = {}
        for key in keys:
            written = await _write_bucket(
                self._db, self._s, scope_of(key), key[1], split=self._split
            )
            buckets[key] = Bucket(float(written["tokens"]), float(written["updated_at"]))
        return buckets, self._now / 1_000_000

    async def count_running(self, keys: Sequence[HandlerKey]) -> dict[HandlerKey, int]:
        running: dict[HandlerKey, int] = {}
        for app_id, task_type in keys:
            # An expired lease holds no slot, rescued or not.
            query: Doc = {
                "status": eq(RUNNING),
                "task_type": eq(task_type),
                "lease_expires_at": {"$gt": self._now},
            }
            if app_id is not None:
                query["app_id"] = app_id
            running[(app_id, task_type)] = await self._db.tasks.count_documents(
                query, session=self._s
            )
        return running

    async def save_buckets(self, tokens: Mapping[HandlerKey, float], now: float) -> None:
        for key, left in tokens.items():
            await self._db.buckets.update_one(
                {"_id": dumps([scope_of(key), key[1]])},
                {"$set": {"tokens": left, "updated_at": now}},
                session=self._s,
            )


async def _write_bucket(
    db: AsyncDatabase[Doc], s: AsyncClientSession, scope: str, task_type: str, *, split: bool
) -> Doc:
    """Write the bucket of ``(scope, task_type)`` (``$inc`` of ``claims``), created
    empty when missing; the bucket as written. One ``find_one_and_update``; with
    ``split`` (``serialize_writes``) an ``update_one`` and a ``find_one``, since
    nx-27017 (the test stand-in) ignores ``$setOnInsert`` in an upserting
    ``find_one_and_update``."""
    bucket_id = dumps([scope, task_type])
    selector: Doc = {"_id": bucket_id}
    change: Doc = {
        "$inc": {"claims": 1},
        # Empty as of the epoch: refilled to full by its first claim.
        "$setOnInsert": {"scope": scope, "task_type": task_type, "tokens": 0.0, "updated_at": 0.0},
    }
    if not split:
        written = await db.buckets.find_one_and_update(
            selector, change, upsert=True, return_document=ReturnDocument.AFTER, session=s
        )
    else:
        await db.buckets.update_one(selector, change, upsert=True, session=s)
        written = await db.buckets.find_one(selector, session=s)
    assert written is not None
    return written
