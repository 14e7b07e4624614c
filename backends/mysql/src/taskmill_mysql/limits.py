"""Global rate limits and global concurrency limits in MySQL / MariaDB: the statements on
the ``rate_buckets`` table that migration 0002 creates, run inside the claim's
transaction (see :mod:`taskmill.limits`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final

import attrs
from taskmill.limits import (
    Bucket,
    limited_caps,
    locked_keys,
    refill,
    scope_of,
    spend,
    taken_by_key,
)
from taskmill.model import Task
from taskmill.storage import ClaimRequest, HandlerKey

from taskmill_mysql.connection import Session

# A missing bucket is created empty as of the epoch, which refills it to full.
_CREATE: Final = (
    "INSERT IGNORE INTO rate_buckets (scope, task_type, tokens, updated_at) VALUES (%s, %s, 0, 0)"
)
_LOCK: Final = (
    "SELECT scope, task_type, tokens, updated_at, UNIX_TIMESTAMP(NOW(6)) FROM rate_buckets "
    "WHERE (scope, task_type) IN ({}) ORDER BY scope, task_type FOR UPDATE"
)
_RUNNING: Final = (
    "SELECT COUNT(*) FROM tasks WHERE status = 'running' AND task_type = %s "
    "AND (%s IS NULL OR app_id = %s) AND lease_expires_at > %s"
)
_SAVE: Final = (
    "UPDATE rate_buckets SET tokens = %s, updated_at = %s WHERE scope = %s AND task_type = %s"
)


@attrs.frozen
class Limited:
    """A claim request with its caps cut by its limits, and what to write back."""

    request: ClaimRequest
    tokens: dict[HandlerKey, float]
    now: float


async def apply_limits(s: Session, request: ClaimRequest, at: datetime) -> Limited:
    """Lock the buckets of the request's limited keys (in (scope, task_type) order, so
    two claims never deadlock on them), count their RUNNING tasks whose lease holds at
    ``at``, and cut the request's caps to what the limits allow now."""
    keys = locked_keys(request.handlers, request.limits)
    tokens: dict[HandlerKey, float] = {}
    running: dict[HandlerKey, int] = {}
    now = 0.0
    if keys:
        pairs = [(scope_of(k), k[1]) for k in keys]
        marks = ", ".join(["(%s, %s)"] * len(pairs))
        lock = _LOCK.format(marks)
        flat = [v for p in pairs for v in p]
        found = {(r[0], r[1]): r for r in await s.fetchall(lock, flat)}
        if len(found) < len(keys):  # a key's first claim: create its bucket, lock again
            await s.executemany(_CREATE, pairs)
            found = {(r[0], r[1]): r for r in await s.fetchall(lock, flat)}
        for key, pair in zip(keys, pairs, strict=True):
            row = found[pair]
            now = float(row[4])
            limit = request.limits[key]
            if limit.rate is not None:
                tokens[key] = refill(Bucket(float(row[2]), float(row[3])), limit.rate, now)
            if limit.max_running is not None:
                counted = await s.fetchone(_RUNNING, [key[1], key[0], key[0], at])
                running[key] = 0 if counted is None else int(counted[0])
    caps = limited_caps(request.handlers, request.limits, tokens=tokens, running=running)
    return Limited(attrs.evolve(request, handlers=caps), tokens, now)


async def spend_tokens(s: Session, limited: Limited, claimed: Sequence[Task]) -> None:
    """Write back the buckets that this claim took tokens from."""
    taken = taken_by_key(((t.app_id, t.task_type) for t in claimed), limited.request.handlers)
    spent = [
        (spend(left, taken[k]), limited.now, scope_of(k), k[1])
        for k, left in limited.tokens.items()
        if taken.get(k)
    ]
    if spent:
        await s.executemany(_SAVE, spent)
