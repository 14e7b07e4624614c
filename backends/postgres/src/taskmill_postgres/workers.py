"""The worker registry in PostgreSQL (the ``worker_registry`` capability): the
statements on the ``workers`` table that migration 0009 creates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from taskmill.storage import StoredWorker

from taskmill_postgres.options import quote_ident


class WorkerStatements:
    """The worker registry's statements for ``schema`` (quoted and qualified)."""

    def __init__(self, schema: str) -> None:
        table = f"{quote_ident(schema)}.workers"
        self.upsert = (
            f"INSERT INTO {table} (id, heartbeat_at, record) VALUES ($1, now(), $2) "
            "ON CONFLICT (id) DO UPDATE SET "
            "heartbeat_at = excluded.heartbeat_at, record = excluded.record"
        )
        self.select = f"SELECT id, heartbeat_at, record FROM {table} ORDER BY id"
        self.delete = f"DELETE FROM {table} WHERE id = $1"
        self.prune = (
            f"DELETE FROM {table} WHERE heartbeat_at < now() - $1::float8 * interval '1 second'"
        )


def workers_of_rows(found: Sequence[Any]) -> list[StoredWorker]:
    """Registrations from the rows of ``select`` (``timestamptz`` reads tz-aware)."""
    return [
        StoredWorker(id=row["id"], heartbeat_at=row["heartbeat_at"], record=row["record"])
        for row in found
    ]


def deleted(status: str) -> int:
    """How many rows a ``DELETE n`` command status counts."""
    return int(status.rsplit(" ", 1)[-1])
