"""How the SQLite backend stores values, and the model objects read back from its rows.

Timestamps are INTEGER microseconds since the epoch (UTC), JSON values text, enums
their value; a task snapshot is selected as :data:`TASK_COLUMNS` and read by
:func:`task`, built by :func:`taskmill.sql.rows.task_reader` from the column names.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from taskmill.model import Task
from taskmill.sql.rows import (
    TASK_COLUMN_NAMES,
    TaskColumn,
    attempt_reader,
    claim_order,
    task_reader,
)

__all__ = [
    "ALIAS_OF",
    "DEDUPE_KEY",
    "ID",
    "SEQ",
    "STATUS_COL",
    "TASK_COLUMNS",
    "Row",
    "as_datetime",
    "as_micros",
    "attempt",
    "claimed",
    "now_us",
    "task",
]

Row = tuple[Any, ...]

_fromtimestamp = datetime.fromtimestamp
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
ONE_US: Final = timedelta(microseconds=1)


def now_us() -> int:
    """The store clock (``time.time()``) in integer microseconds."""
    return time.time_ns() // 1000


_FLOAT_EXACT_US: Final = 4_000_000_000 * 1_000_000
"""Below this (the year 2096) a float of seconds still rounds back to the exact
microsecond; beyond it the fast path would lose microseconds."""


def as_datetime(us: int) -> datetime:
    """A tz-aware UTC datetime from stored microseconds (exact for any date taskmill
    stores, 1970 to 9999)."""
    if us < _FLOAT_EXACT_US:
        return _fromtimestamp(us / 1e6, UTC)
    return _EPOCH + timedelta(microseconds=us)


def as_micros(value: datetime) -> int:
    """Stored microseconds of a tz-aware datetime (exact)."""
    if value.utcoffset() is None:
        raise ValueError(f"a timezone-aware datetime is required, got {value!r}")
    return (value - _EPOCH) // ONE_US


TASK_COLUMNS: Final = ", ".join(TASK_COLUMN_NAMES)
"""The snapshot columns, as every statement that returns a task selects them."""

SEQ: Final = TaskColumn.SEQ
ID: Final = TaskColumn.ID
STATUS_COL: Final = TaskColumn.STATUS
RESULT: Final = TaskColumn.RESULT
ERROR: Final = TaskColumn.ERROR
DEDUPE_KEY: Final = TaskColumn.DEDUPE_KEY
ALIAS_OF: Final = TaskColumn.ALIAS_OF
CANCEL_REASON: Final = TaskColumn.CANCEL_REASON

task: Final = task_reader(TASK_COLUMN_NAMES, timestamp=as_datetime)
"""The snapshot of one row selected as :data:`TASK_COLUMNS`."""

attempt: Final = attempt_reader(timestamp=as_datetime)
"""An execution-log row (:data:`taskmill.sql.rows.ATTEMPT_COLUMN_NAMES`) of a task."""


def claimed(rows: list[Row]) -> list[Task]:
    """Snapshots of claimed rows, in claim order (priority DESC, then creation)."""
    return claim_order(rows, task, TASK_COLUMN_NAMES)
