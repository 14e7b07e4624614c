"""Handler registrations in SQLite (the ``handler_registrations`` capability).

Functions of a connection, run on the storage's database thread inside its
``_write``/``_read`` (see :class:`~taskmill.backends.sqlite.SQLiteStorage`); the table is
created by migration 0003.
"""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime

import attrs

from taskmill.storage import HandlerRegistration

_COLUMNS = "app_id, task_type, url, timeout, max_retries, concurrency, updated_at"
_UPSERT = (
    f"INSERT INTO handler_registrations ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (ifnull(app_id, x''), task_type) DO UPDATE SET url = excluded.url, "
    "timeout = excluded.timeout, max_retries = excluded.max_retries, "
    "concurrency = excluded.concurrency, updated_at = excluded.updated_at"
)
_DELETE = "DELETE FROM handler_registrations WHERE app_id IS ? AND task_type = ?"
_SELECT = (
    f"SELECT {_COLUMNS} FROM handler_registrations "
    "ORDER BY app_id IS NOT NULL, ifnull(app_id, ''), task_type"
)


def put_registration(
    conn: sqlite3.Connection, registration: HandlerRegistration
) -> HandlerRegistration:
    """Insert or replace the registration of its ``(app_id, task_type)``."""
    now_us = time.time_ns() // 1000
    r = registration
    conn.execute(
        _UPSERT,
        (r.app_id, r.task_type, r.url, r.timeout, r.max_retries, r.concurrency, now_us),
    )
    return attrs.evolve(r, updated_at=datetime.fromtimestamp(now_us / 1e6, UTC))


def delete_registration(conn: sqlite3.Connection, key: tuple[str | None, str]) -> bool:
    """Delete the registration of ``key`` = (app id, task type); whether it existed."""
    return conn.execute(_DELETE, key).rowcount > 0


def registrations(conn: sqlite3.Connection, _: None) -> list[HandlerRegistration]:
    """Every registration, the host's first, then by app id and task type."""
    return [
        HandlerRegistration(
            app_id=app_id,
            task_type=task_type,
            url=url,
            timeout=timeout,
            max_retries=max_retries,
            concurrency=concurrency,
            updated_at=datetime.fromtimestamp(updated_us / 1e6, UTC),
        )
        for app_id, task_type, url, timeout, max_retries, concurrency, updated_us in conn.execute(
            _SELECT
        )
    ]
