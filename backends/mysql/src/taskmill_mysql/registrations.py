"""Handler registrations: one row per (app id, task type) in ``handler_registrations``,
replaced atomically by ``INSERT ... ON DUPLICATE KEY UPDATE``."""

from __future__ import annotations

from typing import Final

from taskmill.storage import HandlerRegistration

from taskmill_mysql.connection import Session
from taskmill_mysql.readback import now
from taskmill_mysql.rows import Row, as_datetime

__all__ = ["delete_registration", "put_registration", "registrations"]


_REGISTRATION_COLUMNS: Final = (
    "app_id, task_type, url, timeout, max_retries, concurrency, updated_at"
)


async def put_registration(s: Session, r: HandlerRegistration) -> HandlerRegistration:
    at = await now(s)
    await s.execute(
        f"INSERT INTO handler_registrations ({_REGISTRATION_COLUMNS}) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE url = VALUES(url), "
        "timeout = VALUES(timeout), max_retries = VALUES(max_retries), "
        "concurrency = VALUES(concurrency), updated_at = VALUES(updated_at)",
        (r.app_id, r.task_type, r.url, r.timeout, r.max_retries, r.concurrency, at),
    )
    return _registration(
        (r.app_id, r.task_type, r.url, r.timeout, r.max_retries, r.concurrency, at)
    )


async def delete_registration(s: Session, key: tuple[str | None, str]) -> bool:
    return (
        await s.execute(
            "DELETE FROM handler_registrations WHERE app_id <=> %s AND task_type = %s", key
        )
        > 0
    )


async def registrations(s: Session, _: None) -> list[HandlerRegistration]:
    rows = await s.fetchall(
        f"SELECT {_REGISTRATION_COLUMNS} FROM handler_registrations "
        "ORDER BY app_id IS NOT NULL, app_id, task_type"
    )
    return [_registration(r) for r in rows]


def _registration(row: Row) -> HandlerRegistration:
    app_id, task_type, url, timeout, max_retries, concurrency, updated_at = row
    return HandlerRegistration(
        app_id=app_id,
        task_type=task_type,
        url=url,
        timeout=timeout,
        max_retries=max_retries,
        concurrency=concurrency,
        updated_at=as_datetime(updated_at),
    )
