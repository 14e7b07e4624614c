"""The event log: appending a transaction's events under the ``event_cursor`` row lock,
reading it by cursor, and pruning it (and the tombstones of deleted tasks) by age.

AUTO_INCREMENT is not commit order, so every event seq is drawn from the locked
``event_cursor`` row, held from the draw to the commit: seqs follow commit order and a
cursor never skips an event committed later. Operations collect their events as
:data:`Event` tuples and append them last with :func:`append_events`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Final

import attrs
from taskmill.cursors import position_token, token_position
from taskmill.model import AttemptOutcome, EventKind, TaskEvent, TaskStatus
from taskmill.sql.rows import events_of_rows

from taskmill_mysql import statements as sql
from taskmill_mysql.connection import Session
from taskmill_mysql.readback import now
from taskmill_mysql.rows import as_datetime, task

__all__ = ["QUOTED", "Event", "Inserted", "append_events", "prune_events", "read_events"]

Event = tuple[int, str, str, str, datetime]
"""An event to append: (task seq, task id, kind, status, at)."""

QUOTED: Final = {
    value: f"'{value}'"
    for value in [
        *(k.value for k in EventKind),
        *(t.value for t in TaskStatus),
        *(o.value for o in AttemptOutcome),
    ]
}
"""Event kinds, statuses and attempt outcomes as SQL literals (plain words: nothing to
escape)."""


@attrs.frozen
class Inserted:
    """The seqs of the tasks one multi-row ``INSERT`` stored: ``first``, ``first +
    step``, ... (``count`` of them), in the order of its rows."""

    first: int
    step: int
    count: int

    @property
    def last(self) -> int:
        return self.first + self.step * (self.count - 1)


async def append_events(
    s: Session,
    events: list[Event],
    *,
    enqueued: Sequence[Inserted] = (),
    at: datetime | None = None,
) -> None:
    """Append the ENQUEUED events of the tasks ``enqueued`` (written at ``at``), then
    ``events``, in order, drawing their seqs from the locked ``event_cursor`` row: the
    last statements of a transaction (deferred, so they go to the server with the
    ``COMMIT``), so that the row lock is held only from here to the commit and seqs
    follow commit order. The draw leaves the last seq in ``LAST_INSERT_ID()``, from
    which the ``INSERT`` numbers the events on the server; the events of ``enqueued``
    are copied from their task rows there (nothing rendered per task)."""
    count = len(events) + sum(inserted.count for inserted in enqueued)
    if not count:
        return
    s.defer(sql.EVENT_CURSOR_DRAW, (count,))
    back = count
    for inserted in enqueued:
        back -= inserted.count
        s.defer(
            sql.INSERT_ENQUEUED_EVENTS,
            (back + inserted.count - 1, inserted.first, inserted.step, at, inserted.first,
             inserted.last),
        )  # fmt: skip
    literal = s.literal
    rows: list[str] = []
    for seq, task_id, kind, status, when in events:
        back -= 1
        rows.append(
            f"(LAST_INSERT_ID() - {back:d}, {seq:d}, {literal(task_id)}, "
            f"{QUOTED[kind]}, {QUOTED[status]}, {literal(when)})"
        )
    s.defer_values(sql.INSERT_EVENTS, rows)


async def read_events(s: Session, args: tuple[str | None, int]) -> tuple[list[TaskEvent], str]:
    """Up to ``limit`` events after the cursor ``after``, each with its task's current
    snapshot (its tombstone when its finish deleted it; none, and the event skipped,
    when ``cleanup`` did), and the cursor after them; ``after`` None: the cursor of the
    log's end."""
    after, limit = args
    if after is None:
        last = await s.fetchone(sql.EVENT_CURSOR)
        return [], position_token(0 if last is None else int(last[0]))
    position = token_position(after)
    if limit <= 0:
        return [], after
    rows = await s.fetchall(sql.READ_EVENTS, (position, limit))
    if not rows:
        return [], after
    events = events_of_rows(rows, task=task, timestamp=as_datetime)
    return events, position_token(int(rows[-1][0]))


async def prune_events(s: Session, older_than: timedelta) -> int:
    """Delete the events recorded more than ``older_than`` ago, and the tombstones of the
    tasks deleted that long ago; how many events."""
    cutoff = await now(s) - older_than
    s.defer(sql.PRUNE_TOMBSTONES, (cutoff,))
    # Seqs are drawn under the cursor lock, so `at` only grows with seq: the events to
    # delete are the prefix of the log before the first young one.
    first_young = await s.fetchone(sql.FIRST_YOUNG_EVENT, (cutoff,))
    if first_young is None:
        return await s.execute("DELETE FROM events WHERE at < %s", (cutoff,))
    return await s.execute("DELETE FROM events WHERE seq < %s", (first_young[0],))
