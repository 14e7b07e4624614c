"""Global rate limits and global concurrency limits in PostgreSQL: the statements on the
``rate_buckets`` table that migration 0003 creates, run inside the claim's transaction
(see :mod:`taskmill.limits`)."""

from __future__ import annotations

from collections.abc import Sequence

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

from taskmill_postgres.options import quote_ident
from taskmill_postgres.schema import Conn


class LimitStatements:
    """The limit statements for ``schema`` (quoted and qualified)."""

    def __init__(self, schema: str) -> None:
        buckets = f"{quote_ident(schema)}.rate_buckets"
        tasks = f"{quote_ident(schema)}.tasks"
        # A missing bucket is created empty as of the epoch, which refills it to full.
        self.create = (
            f"INSERT INTO {buckets} (scope, task_type, tokens, updated_at) "
            "SELECT s, t, 0, 0 FROM unnest($1::text[], $2::text[]) AS k(s, t) "
            "ON CONFLICT (scope, task_type) DO NOTHING"
        )
        # Locked in (scope, task_type) order, so two claims never deadlock on them.
        self.lock = (
            "SELECT b.scope, b.task_type, b.tokens, b.updated_at, "
            "extract(epoch FROM clock_timestamp())::float8 AS now "
            f"FROM {buckets} AS b JOIN unnest($1::text[], $2::text[]) AS k(s, t) "
            "ON b.scope = k.s AND b.task_type = k.t "
            "ORDER BY b.scope, b.task_type FOR UPDATE OF b"
        )
        self.running = (
            f"SELECT count(*) FROM {tasks} WHERE status = 'running' AND task_type = $1 "
            "AND ($2::text IS NULL OR app_id = $2) AND lease_expires_at > now()"
        )
        self.save = (
            f"UPDATE {buckets} AS b SET tokens = k.tokens, updated_at = $4 "
            "FROM unnest($1::text[], $2::text[], $3::float8[]) AS k(s, t, tokens) "
            "WHERE b.scope = k.s AND b.task_type = k.t"
        )


@attrs.frozen
class Limited:
    """A claim request with its caps cut by its limits, and what to write back."""

    request: ClaimRequest
    tokens: dict[HandlerKey, float]
    now: float


async def apply_limits(conn: Conn, sql: LimitStatements, request: ClaimRequest) -> Limited:
    """Lock the buckets of the request's limited keys, count their RUNNING tasks, and cut
    the request's caps to what the limits allow now (inside the caller's transaction)."""
    keys = locked_keys(request.handlers, request.limits)
    tokens: dict[HandlerKey, float] = {}
    running: dict[HandlerKey, int] = {}
    now = 0.0
    if keys:
        scopes = [scope_of(k) for k in keys]
        types = [k[1] for k in keys]
        found = {(r["scope"], r["task_type"]): r for r in await conn.fetch(sql.lock, scopes, types)}
        if len(found) < len(keys):  # a key's first claim: create its bucket, lock again
            await conn.execute(sql.create, scopes, types)
            found = {
                (r["scope"], r["task_type"]): r for r in await conn.fetch(sql.lock, scopes, types)
            }
        for key in keys:
            row = found[(scope_of(key), key[1])]
            now = row["now"]
            limit = request.limits[key]
            if limit.rate is not None:
                bucket = Bucket(row["tokens"], row["updated_at"])
                tokens[key] = refill(bucket, limit.rate, now)
            if limit.max_running is not None:
                running[key] = await conn.fetchval(sql.running, key[1], key[0])
    caps = limited_caps(request.handlers, request.limits, tokens=tokens, running=running)
    return Limited(attrs.evolve(request, handlers=caps), tokens, now)


async def spend_tokens(
    conn: Conn, sql: LimitStatements, limited: Limited, claimed: Sequence[Task]
) -> None:
    """Write back the buckets that this claim took tokens from."""
    taken = taken_by_key(((t.app_id, t.task_type) for t in claimed), limited.request.handlers)
    spent = [(k, spend(left, taken[k])) for k, left in limited.tokens.items() if taken.get(k)]
    if spent:
        await conn.execute(
            sql.save,
            [scope_of(k) for k, _ in spent],
            [k[1] for k, _ in spent],
            [left for _, left in spent],
            limited.now,
        )
