"""Handler registrations in PostgreSQL (the ``handler_registrations`` capability): the
statements on the ``handler_registrations`` table that migration 0002 creates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from taskmill.storage import HandlerRegistration

from taskmill_postgres.options import quote_ident

_COLUMNS = "app_id, task_type, url, timeout, max_retries, concurrency, updated_at"


class RegistrationStatements:
    """The registration statements for ``schema`` (quoted and qualified)."""

    def __init__(self, schema: str) -> None:
        table = f"{quote_ident(schema)}.handler_registrations"
        self.upsert = (
            f"INSERT INTO {table} ({_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, now()) "
            "ON CONFLICT ((coalesce(app_id, '')), (app_id IS NULL), task_type) DO UPDATE SET "
            "url = excluded.url, timeout = excluded.timeout, "
            "max_retries = excluded.max_retries, concurrency = excluded.concurrency, "
            "updated_at = excluded.updated_at RETURNING updated_at"
        )
        self.delete = f"DELETE FROM {table} WHERE app_id IS NOT DISTINCT FROM $1 AND task_type = $2"
        self.select = (
            f"SELECT {_COLUMNS} FROM {table} "
            "ORDER BY app_id IS NOT NULL, coalesce(app_id, ''), task_type"
        )


def upsert_arguments(registration: HandlerRegistration) -> tuple[Any, ...]:
    """The arguments of ``upsert`` for ``registration``."""
    r = registration
    return (r.app_id, r.task_type, r.url, r.timeout, r.max_retries, r.concurrency)


def from_rows(found: Sequence[Any]) -> list[HandlerRegistration]:
    """Registrations from the rows of ``select``."""
    return [
        HandlerRegistration(
            app_id=row["app_id"],
            task_type=row["task_type"],
            url=row["url"],
            timeout=row["timeout"],
            max_retries=row["max_retries"],
            concurrency=row["concurrency"],
            updated_at=row["updated_at"],
        )
        for row in found
    ]
