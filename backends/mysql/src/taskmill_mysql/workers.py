"""The worker registry (docs/workers.md): one row per worker in ``workers``, its
heartbeat the server clock (``NOW(6)``), replaced by ``INSERT ... ON DUPLICATE KEY
UPDATE``."""

from __future__ import annotations

from datetime import timedelta

from taskmill.storage import StoredWorker

from taskmill_mysql.connection import Session
from taskmill_mysql.rows import as_datetime

__all__ = ["prune_workers", "put_worker", "remove_worker", "workers"]


async def put_worker(s: Session, args: tuple[str, str]) -> None:
    await s.execute(
        "INSERT INTO workers (id, heartbeat_at, record) VALUES (%s, NOW(6), %s) "
        "ON DUPLICATE KEY UPDATE heartbeat_at = VALUES(heartbeat_at), record = VALUES(record)",
        args,
    )


async def workers(s: Session, _: None) -> list[StoredWorker]:
    rows = await s.fetchall("SELECT id, heartbeat_at, record FROM workers ORDER BY id")
    return [
        StoredWorker(id=worker_id, heartbeat_at=as_datetime(at), record=record)
        for worker_id, at, record in rows
    ]


async def remove_worker(s: Session, worker_id: str) -> bool:
    return await s.execute("DELETE FROM workers WHERE id = %s", (worker_id,)) > 0


async def prune_workers(s: Session, older_than: timedelta) -> int:
    return await s.execute(
        "DELETE FROM workers WHERE heartbeat_at < NOW(6) - INTERVAL %s MICROSECOND",
        (older_than // timedelta(microseconds=1),),
    )
