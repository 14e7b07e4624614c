"""What a task's end settles in the same transaction: a terminal leader's PENDING
aliases, and the dependents of the tasks that ended, breadth first.

The decisions are the lifecycle kernel's (:func:`~taskmill.lifecycle.dependency_settles`,
:func:`~taskmill.lifecycle.dependency_blocks`, :data:`~taskmill.lifecycle.TERMINAL_EVENTS`);
the events they cause are appended to the operation's list (see
:mod:`taskmill_mysql.events`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from taskmill.lifecycle import (
    CANCELLATION,
    TERMINAL_EVENTS,
    DependentOutcome,
    dependency_blocks,
    dependency_error,
    dependency_settles,
)
from taskmill.model import EventKind
from taskmill.sql.rows import STATUS

from taskmill_mysql import statements as sql
from taskmill_mysql.connection import Session
from taskmill_mysql.events import Event
from taskmill_mysql.packets import chunks
from taskmill_mysql.readback import by_seq
from taskmill_mysql.rows import CANCEL_REASON, ERROR, ID, RESULT, SEQ, STATUS_COL, Row

__all__ = ["settle_aliases", "settle_dependents"]

_TERMINAL_EVENT: Final = {s.value: e.value for s, e in TERMINAL_EVENTS.items()}
_RELEASED: Final = EventKind.RELEASED.value
_CANCELLED_EVENT: Final = CANCELLATION.event.value


async def settle_aliases(s: Session, leader: Row, at: datetime, events: list[Event]) -> list[Row]:
    """Give a terminal leader's PENDING aliases its status, result, error and cancel
    reason; append their events (the leader's terminal kind).

    :returns: the aliases' new rows, in creation order.
    """
    locked = await s.fetchall(sql.LOCK_ALIASES, (leader[ID],))
    if not locked:
        return []
    status = leader[STATUS_COL]
    s.defer(
        sql.SETTLE_ALIASES,
        (status, leader[RESULT], leader[ERROR], leader[CANCEL_REASON], at, at, leader[ID]),
    )
    rows = await by_seq(s, [r[0] for r in locked])
    kind = _TERMINAL_EVENT[status]
    events += [(r[SEQ], r[ID], kind, status, at) for r in rows]
    return rows


async def settle_dependents(
    s: Session, ended: list[tuple[str, str]], at: datetime, events: list[Event]
) -> list[Row]:
    """Settle the dependents of the tasks that just ended, given as (id, stored status),
    as :func:`taskmill.lifecycle.dependency_settles` says, and in turn those of the
    dependents that cancels; append the events to ``events``.

    :returns: the rows of the dependents cancelled.
    """
    cancelled: list[Row] = []
    level = ended
    while level:
        status_of = dict(level)
        edges: list[Row] = []
        for chunk in chunks(list(status_of)):
            found = await s.fetchall(sql.lock_edges(len(chunk)), chunk)
            if found:
                edges += found
                s.defer(sql.delete_edges(len(chunk)), chunk)
        level = []
        for dependency, dependent_id, always in edges:
            s.defer(sql.COUNT_DOWN, (dependent_id,))
            row = await s.fetchone(sql.WAITING_OF, (dependent_id,))
            if row is None:
                continue  # deleted by cleanup
            seq, status, left = row
            ended_as = STATUS[status_of[dependency]]
            blocks = bool(dependency_blocks(ended_as, bool(always)))
            outcome = dependency_settles(STATUS[status], left, blocks=blocks)
            if outcome is DependentOutcome.RELEASED:
                events.append((seq, dependent_id, _RELEASED, "pending", at))
            elif outcome is DependentOutcome.CANCELLED:
                error = dependency_error(dependency, ended_as)
                s.defer(sql.DEPENDENCY_CANCEL, {"now": at, "error": error, "seq": seq})
                events.append((seq, dependent_id, _CANCELLED_EVENT, "cancelled", at))
                cancelled += await by_seq(s, [seq])
                level.append((dependent_id, "cancelled"))
    return cancelled
