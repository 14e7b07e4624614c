"""Values and snapshots of the MySQL backend: timestamps at the edge, and model objects
from the rows it reads (:func:`task`, :func:`attempt`, :func:`event`).

Timestamps are ``DATETIME(6)`` in UTC. aiomysql returns them as naive datetimes and
formats a datetime argument without its time zone, so every value crosses the edge
through :func:`as_datetime` (stored → tz-aware) or :func:`as_stored` (any tz-aware
datetime → naive UTC). Rows are mapped by column name once (:mod:`taskmill.sql.rows`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Final

import attrs
from taskmill.sql.rows import (
    STATUS,
    TASK_COLUMN_NAMES,
    TaskColumn,
    attempt_reader,
    column_index,
    task_reader,
)

__all__ = [
    "ALIAS_OF",
    "CANCEL_REASON",
    "FENCE_COLUMN_NAMES",
    "ID",
    "NARROW_FENCE",
    "SEQ",
    "SNAPSHOT_FENCE",
    "STATUS",
    "STATUS_COL",
    "TASK_COLUMNS",
    "TASK_JSON",
    "Fence",
    "Row",
    "as_datetime",
    "as_stored",
    "attempt",
    "claimed_row",
    "fence_from_json",
    "from_json",
    "task",
]

Row = tuple[Any, ...]
"""A row as aiomysql's default cursor returns it."""

TASK_COLUMNS: Final = ", ".join(TASK_COLUMN_NAMES)
SEQ: Final = TaskColumn.SEQ
ID: Final = TaskColumn.ID
STATUS_COL: Final = TaskColumn.STATUS
RESULT: Final = TaskColumn.RESULT
ERROR: Final = TaskColumn.ERROR
DEDUPE_KEY: Final = TaskColumn.DEDUPE_KEY
ALIAS_OF: Final = TaskColumn.ALIAS_OF
CANCEL_REASON: Final = TaskColumn.CANCEL_REASON
PRIORITY: Final = TaskColumn.PRIORITY
_AT: Final = column_index(TASK_COLUMN_NAMES)
STATUS_AT, ATTEMPTS, WORKER_ID = _AT["status"], _AT["attempts"], _AT["worker_id"]
STARTED_AT, UPDATED_AT, LEASE = _AT["started_at"], _AT["updated_at"], _AT["lease_expires_at"]


def as_datetime(value: datetime) -> datetime:
    """A stored (naive, UTC) timestamp as a tz-aware datetime."""
    return value.replace(tzinfo=UTC)


def as_stored(value: datetime) -> datetime:
    """A tz-aware datetime as the naive UTC value a ``DATETIME(6)`` column holds."""
    return value.astimezone(UTC).replace(tzinfo=None)


task: Final = task_reader(TASK_COLUMN_NAMES, timestamp=as_datetime)
"""The snapshot of one row selected as :data:`TASK_COLUMNS`."""

attempt: Final = attempt_reader(timestamp=as_datetime)
"""An execution-log row (number, worker_id, started_at, finished_at, outcome, error)."""


TASK_JSON: Final = f"JSON_ARRAY({TASK_COLUMNS}), seq"
"""A snapshot selected as one column, then its seq (read by :func:`from_json`).

PyMySQL parses rows in pure Python, column by column: one JSON text is parsed by the
C ``json`` module instead, about 40 % cheaper per snapshot. The server renders every
value in the JSON as it does in the text protocol (a ``DOUBLE`` in the same digits,
a ``DATETIME(6)`` as ``YYYY-MM-DD hh:mm:ss.ffffff``); the text columns are strings
(``LONGTEXT``, not the ``JSON`` type), so they come back byte for byte."""
_TIMESTAMP_AT: Final = tuple(
    _AT[c]
    for c in (
        "created_at", "run_at", "updated_at", "started_at", "finished_at", "lease_expires_at",
    )
)  # fmt: skip
_DOUBLE_AT: Final = (_AT["progress_done"], _AT["progress_total"])
_parse_json: Final = json.loads
_parse_datetime: Final = datetime.fromisoformat


def from_json(row: Row) -> Row | None:
    """A row selected as :data:`TASK_JSON` (and maybe more columns) as the row selected
    as :data:`TASK_COLUMNS` (and the same more columns) would be; None when the server
    gave no JSON (it returns NULL for a value longer than ``max_allowed_packet``): read
    that one by its seq, ``row[1]``."""
    text = row[0]
    if text is None:
        return None
    values = _parse_json(text)
    for i in _TIMESTAMP_AT:
        value = values[i]
        if value is not None:
            values[i] = _parse_datetime(value)
    for i in _DOUBLE_AT:
        value = values[i]
        if value is not None:
            values[i] = float(value)
    return (*values, *row[2:])


def fence_from_json(row: Row) -> Row:
    """A row selected as ``JSON_ARRAY(<FENCE_COLUMN_NAMES>), NOW(6)`` as the row
    selected as those columns and ``NOW(6)`` would be (they are all text and integers,
    and short: their JSON is never NULL)."""
    return (*_parse_json(row[0]), row[1])


def claimed_row(row: Row, worker_id: str, at: datetime, lease: datetime) -> Row:
    """A PENDING row selected as :data:`TASK_COLUMNS` as the claim's ``UPDATE``
    (``statements.CLAIM_UPDATE``) leaves it: RUNNING, one more attempt, this worker's
    lease, started and updated now."""
    new = list(row)
    new[STATUS_AT] = "running"
    new[ATTEMPTS] = row[ATTEMPTS] + 1
    new[WORKER_ID] = worker_id
    new[STARTED_AT] = new[UPDATED_AT] = at
    new[LEASE] = lease
    return tuple(new)


FENCE_COLUMN_NAMES: Final = (
    "seq", "id", "worker_id", "attempts", "cancel_reason", "dedupe_key", "alias_of",
)  # fmt: skip
"""The columns a finish reads of a locked row when it builds no snapshot: its fence
(worker id, attempt), whether a stop was requested, and whether it leads aliases."""


@attrs.frozen
class Fence:
    """Where a locked row holds each of :data:`FENCE_COLUMN_NAMES`."""

    seq: int
    id: int
    worker_id: int
    attempts: int
    cancel_reason: int
    dedupe_key: int
    alias_of: int

    @classmethod
    def of(cls, columns: tuple[str, ...]) -> Fence:
        """The positions in a row selected as ``columns``."""
        at = column_index(columns)
        return cls(*(at[name] for name in FENCE_COLUMN_NAMES))


SNAPSHOT_FENCE: Final = Fence.of(TASK_COLUMN_NAMES)
"""In a row selected as :data:`TASK_COLUMNS`."""
NARROW_FENCE: Final = Fence.of(FENCE_COLUMN_NAMES)
"""In a row selected as :data:`FENCE_COLUMN_NAMES`."""
