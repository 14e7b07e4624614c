"""Model objects from the rows the PostgreSQL backend reads (the other direction of its
statements): :func:`task`, :func:`attempt`, :func:`event`."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Final, TypeAlias

import asyncpg
from taskmill.model import (
    NO_PROGRESS,
    Attempt,
    AttemptOutcome,
    CancelReason,
    EventKind,
    Progress,
    Task,
    TaskEvent,
    TaskStatus,
)

Row: TypeAlias = asyncpg.Record | tuple[Any, ...]
"""An asyncpg ``Record``, or a tuple sliced from one."""

loads: Final = json.JSONDecoder().decode
"""json.loads without its wrapper: the stored JSON text was written by
:func:`taskmill.serialization.dumps`."""

STATUS: Final = {s.value: s for s in TaskStatus}
REASON: Final = {r.value: r for r in CancelReason}
OUTCOME: Final = {o.value: o for o in AttemptOutcome}
KIND: Final = {k.value: k for k in EventKind}
TERMINAL_VALUES: Final = frozenset({"completed", "failed", "cancelled"})
TERMINAL_EVENT: Final = {"completed": "completed", "failed": "failed", "cancelled": "cancelled"}
"""The event kind of a transition to each terminal status."""

# Positions in statements.TASK_COLUMN_NAMES used outside task().
SEQ, ID, STATUS_COL, PRIORITY, DEDUPE_KEY, ALIAS_OF = 0, 1, 3, 10, 18, 19


def task(r: Row) -> Task:
    """The snapshot of one row selected as ``statements.TASK_COLUMNS``."""
    data = r[9]
    result = r[13]
    done, total, message = r[15], r[16], r[17]
    reason = r[22]
    return Task(
        id=r[1],
        task_type=r[2],
        status=STATUS[r[3]],
        created_at=r[4],
        run_at=r[5],
        updated_at=r[6],
        app_id=r[7],
        params=loads(r[8]),
        data={} if data == "{}" else loads(data),
        priority=r[10],
        attempts=r[11],
        max_retries=r[12],
        result=None if result is None or result == "null" else loads(result),
        error=r[14],
        progress=(
            NO_PROGRESS
            if done == 0 and total is None and message is None
            else Progress(done, total, message)
        ),
        dedupe_key=r[18],
        alias_of=r[19],
        parent_id=r[20],
        user_id=r[21],
        cancel_reason=None if reason is None else REASON[reason],
        started_at=r[23],
        finished_at=r[24],
        worker_id=r[25],
        lease_expires_at=r[26],
    )


def claim_order(rows: list[asyncpg.Record]) -> list[Task]:
    """Snapshots of claimed rows (RETURNING leaves their order unspecified) in claim
    order: priority DESC, then creation."""
    rows.sort(key=lambda r: (-r[PRIORITY], r[SEQ]))
    return [task(r) for r in rows]


def attempt(task_id: str, r: Row) -> Attempt:
    """An execution-log row (number, worker_id, started_at, finished_at, outcome, error)."""
    return Attempt(
        task_id=task_id,
        number=r[0],
        worker_id=r[1],
        started_at=r[2],
        finished_at=r[3],
        outcome=OUTCOME[r[4]],
        error=r[5],
    )


def event(r: Row, snapshot: Task) -> TaskEvent:
    """An event-log row (seq, kind, status, at, ...) with its task's snapshot."""
    at: datetime = r[3]
    return TaskEvent(kind=KIND[r[1]], task=snapshot, status=STATUS[r[2]], at=at, cursor=r[0])
