"""Global rate limits and global concurrency limits in MySQL / MariaDB: the statements on
the ``rate_buckets`` table that migration 0002 creates, run inside the claim's
transaction by the limit engine (:mod:`taskmill.limiting`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Final

from taskmill.limits import Bucket, scope_of
from taskmill.storage import HandlerKey

from taskmill_mysql.connection import Session

__all__ = ["MySQLBuckets"]

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


class MySQLBuckets:
    """:class:`taskmill.limiting.BucketLedger` in claim session ``s``, whose prelude
    read the store clock ``at``: the bucket rows are locked ``FOR UPDATE`` in
    ``(scope, task_type)`` order (so two claims never deadlock on them), and a lease
    holds while it ends after ``at``."""

    __slots__ = ("_at", "_s")

    def __init__(self, s: Session, at: datetime) -> None:
        self._s = s
        self._at = at

    async def lock_buckets(
        self, keys: Sequence[HandlerKey]
    ) -> tuple[dict[HandlerKey, Bucket], float]:
        s = self._s
        pairs = [(scope_of(k), k[1]) for k in keys]
        lock = _LOCK.format(", ".join(["(%s, %s)"] * len(pairs)))
        flat = [v for p in pairs for v in p]
        found = {(r[0], r[1]): r for r in await s.fetchall(lock, flat)}
        if len(found) < len(keys):  # a key's first claim: create its bucket, lock again
            await s.executemany(_CREATE, pairs)
            found = {(r[0], r[1]): r for r in await s.fetchall(lock, flat)}
        buckets: dict[HandlerKey, Bucket] = {}
        now = 0.0
        for key, pair in zip(keys, pairs, strict=True):
            row = found[pair]
            now = float(row[4])
            buckets[key] = Bucket(float(row[2]), float(row[3]))
        return buckets, now

    async def count_running(self, keys: Sequence[HandlerKey]) -> dict[HandlerKey, int]:
        running: dict[HandlerKey, int] = {}
        for key in keys:
            counted = await self._s.fetchone(_RUNNING, [key[1], key[0], key[0], self._at])
            running[key] = 0 if counted is None else int(counted[0])
        return running

    async def save_buckets(self, tokens: Mapping[HandlerKey, float], now: float) -> None:
        await self._s.executemany(
            _SAVE, [(left, now, scope_of(k), k[1]) for k, left in tokens.items()]
        )
