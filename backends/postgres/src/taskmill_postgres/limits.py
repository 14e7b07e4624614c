"""Global rate limits and global concurrency limits in PostgreSQL: the statements on the
``rate_buckets`` table that migration 0003 creates, run inside the claim's transaction
by the limit engine (:mod:`taskmill.limiting`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from taskmill.limits import Bucket, scope_of
from taskmill.storage import HandlerKey

from taskmill_postgres.options import quote_ident
from taskmill_postgres.schema import Conn

__all__ = ["LimitStatements", "PostgresBuckets"]


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


class PostgresBuckets:
    """:class:`taskmill.limiting.BucketLedger` on ``conn`` inside a claim's transaction:
    the bucket rows are locked ``FOR UPDATE`` in ``(scope, task_type)`` order (one
    statement, the missing ones created with one more), the store's clock is
    ``clock_timestamp()`` at the lock, and a lease holds while it ends after the
    transaction's ``now()``."""

    __slots__ = ("_conn", "_sql")

    def __init__(self, conn: Conn, sql: LimitStatements) -> None:
        self._conn = conn
        self._sql = sql

    async def lock_buckets(
        self, keys: Sequence[HandlerKey]
    ) -> tuple[dict[HandlerKey, Bucket], float]:
        conn, sql = self._conn, self._sql
        scopes = [scope_of(k) for k in keys]
        types = [k[1] for k in keys]
        found = {(r["scope"], r["task_type"]): r for r in await conn.fetch(sql.lock, scopes, types)}
        if len(found) < len(keys):  # a key's first claim: create its bucket, lock again
            await conn.execute(sql.create, scopes, types)
            found = {
                (r["scope"], r["task_type"]): r for r in await conn.fetch(sql.lock, scopes, types)
            }
        buckets: dict[HandlerKey, Bucket] = {}
        now = 0.0
        for key in keys:
            row = found[(scope_of(key), key[1])]
            now = row["now"]
            buckets[key] = Bucket(row["tokens"], row["updated_at"])
        return buckets, now

    async def count_running(self, keys: Sequence[HandlerKey]) -> dict[HandlerKey, int]:
        running: dict[HandlerKey, int] = {}
        for key in keys:
            running[key] = await self._conn.fetchval(self._sql.running, key[1], key[0])
        return running

    async def save_buckets(self, tokens: Mapping[HandlerKey, float], now: float) -> None:
        await self._conn.execute(
            self._sql.save,
            [scope_of(k) for k in tokens],
            [k[1] for k in tokens],
            list(tokens.values()),
            now,
        )
