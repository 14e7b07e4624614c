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
  its tokens, counts the key's RUNNING tasks and cuts its caps
  (:func:`taskmill.limits.limited_caps`), all inside the claim's transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pymongo import ASCENDING, DESCENDING, ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from taskmill.limits import Bucket, limited_caps, locked_keys, refill, scope_of, spend, taken_by_key
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
        handlers = request.handlers
        tokens: dict[HandlerKey, float] = {}
        if request.limits:
            handlers, tokens = await _limited(db, s, request, now, conn.options.serialize_writes)
            if not any(cap != 0 for cap in handlers.values()):
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
        if tokens:
            await _spend(db, s, tokens, handlers, claimed, now)
        writes = Writes()
        for t in claimed:
            writes.emit(EventKind.STARTED, t)
        await record(db, s, writes, now)
        return claimed

    return await transaction(conn, body)


async def _limited(
    db: AsyncDatabase[Doc],
    s: AsyncClientSession,
    request: ClaimRequest,
    now: int,
    serialize_writes: bool,
) -> tuple[dict[HandlerKey, int | None], dict[HandlerKey, float]]:
    """The request's caps cut by its global limits (:mod:`taskmill.limits`), and the
    refilled tokens of its rate-limited keys, inside claim transaction ``s``.

    Each limited key's bucket document (created full when missing) is *written*
    first (``$inc`` of ``claims``), in a stable order: two claims of one key both
    write it, so on MongoDB they cannot both commit from the same snapshot (the
    second aborts with a write conflict and runs again on the new state). That is
    what makes the tokens read and the RUNNING tasks counted here hold when this
    claim commits, in the role MySQL's ``FOR UPDATE`` on the bucket row plays."""
    seconds = now / 1_000_000
    tokens: dict[HandlerKey, float] = {}
    running: dict[HandlerKey, int] = {}
    for key in locked_keys(request.handlers, request.limits):
        scope, task_type = scope_of(key), key[1]
        bucket = await _write_bucket(db, s, scope, task_type, split=serialize_writes)
        limit = request.limits[key]
        if limit.rate is not None:
            stored = Bucket(float(bucket["tokens"]), float(bucket["updated_at"]))
            tokens[key] = refill(stored, limit.rate, seconds)
        if limit.max_running is not None:
            # An expired lease holds no slot, rescued or not.
            query: Doc = {
                "status": eq(RUNNING),
                "task_type": eq(task_type),
                "lease_expires_at": {"$gt": now},
            }
            if key[0] is not None:
                query["app_id"] = key[0]
            running[key] = await db.tasks.count_documents(query, session=s)
    caps = limited_caps(request.handlers, request.limits, tokens=tokens, running=running)
    return caps, tokens


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


async def _spend(
    db: AsyncDatabase[Doc],
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
            await db.buckets.update_one(
                {"_id": dumps([scope_of(key), key[1]])},
                {"$set": {"tokens": spend(left, taken[key]), "updated_at": now / 1_000_000}},
                session=s,
            )
