"""Model objects from the rows the PostgreSQL backend reads (the other direction of its
statements): :func:`task`, :func:`attempt`, :func:`event`.

Rows are mapped by column name once (:mod:`taskmill.sql.rows`); asyncpg returns
timestamptz values as tz-aware datetimes, so no conversion is needed.
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias

import asyncpg
from taskmill.model import Task
from taskmill.sql.rows import (
    KIND,
    OUTCOME,
    REASON,
    STATUS,
    TASK_COLUMN_NAMES,
    TaskColumn,
    attempt_reader,
    loads,
    task_reader,
)
from taskmill.sql.rows import claim_order as _claim_order

__all__ = [
    "KIND",
    "OUTCOME",
    "REASON",
    "STATUS",
    "Row",
    "attempt",
    "claim_order",
    "loads",
    "task",
]

Row: TypeAlias = asyncpg.Record | tuple[Any, ...]
"""An asyncpg ``Record``, or a tuple sliced from one."""

SEQ: Final = TaskColumn.SEQ
ID: Final = TaskColumn.ID
STATUS_COL: Final = TaskColumn.STATUS
DEDUPE_KEY: Final = TaskColumn.DEDUPE_KEY
ALIAS_OF: Final = TaskColumn.ALIAS_OF
"""Positions in ``statements.TASK_COLUMNS`` used outside :func:`task`."""

task: Final = task_reader(TASK_COLUMN_NAMES)
"""The snapshot of one row selected as ``statements.TASK_COLUMNS``."""

attempt: Final = attempt_reader()
"""An execution-log row (number, worker_id, started_at, finished_at, outcome, error)."""


def claim_order(rows: list[asyncpg.Record]) -> list[Task]:
    """Snapshots of claimed rows (RETURNING leaves their order unspecified) in claim
    order: priority DESC, then creation."""
    return _claim_order(rows, task, TASK_COLUMN_NAMES)
