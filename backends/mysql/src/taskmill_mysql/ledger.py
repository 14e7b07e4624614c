"""The MySQL / MariaDB side of the settlement engine (:mod:`taskmill.settlement`): the
locking reads and the writes of one transaction that the engine sequences when tasks
end (their aliases, their dependents, the delete of a finish with ``delete``) and when a
cancel runs.

Writes are deferred (:meth:`~taskmill_mysql.connection.Session.defer`) and sent with the
next read; the rows the engine needs back are read by seq
(:func:`~taskmill_mysql.readback.by_seq`). The engine handles :class:`Ref`\\ s: the
finish path knows a task's seq, id, status and alias columns without reading its row
back, and the row is read only when an alias needs the leader as stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final

import attrs
from taskmill.lifecycle import settles_aliases
from taskmill.model import Attempt, CancelReason, EventKind, TaskStatus
from taskmill.settlement import Active, Edge
from taskmill.sql.rows import STATUS, attempt_row

from taskmill_mysql import statements as sql
from taskmill_mysql.connection import Session
from taskmill_mysql.events import Event
from taskmill_mysql.packets import chunks
from taskmill_mysql.readback import by_seq
from taskmill_mysql.rows import (
    ALIAS_OF,
    CANCEL_REASON,
    DEDUPE_KEY,
    ERROR,
    ID,
    RESULT,
    SEQ,
    STATUS_COL,
    Row,
    as_datetime,
    as_stored,
)

__all__ = ["MySQLLedger", "Ref"]

_ACTIVE_COLUMNS: Final = "seq, id, status, alias_of, worker_id, attempts, started_at"


@attrs.frozen(slots=True)
class Ref:
    """A task as the engine handles it: what identifies it and decides its aliases, and
    its stored row once read."""

    seq: int
    id: str
    status: TaskStatus
    dedupe_key: str | None
    alias_of: str | None
    row: Row | None = None
    buried: bool = False
    """Ended by a finish with ``delete`` that wrote its tombstone instead of updating
    its row (:func:`~taskmill_mysql.statements.bury_sql`): the row is left as it was,
    to be deleted by :meth:`MySQLLedger.forget`."""

    @classmethod
    def of(cls, row: Row) -> Ref:
        """The ref of a row read as :data:`~taskmill_mysql.rows.TASK_COLUMNS`."""
        return cls(row[SEQ], row[ID], STATUS[row[STATUS_COL]], row[DEDUPE_KEY], row[ALIAS_OF], row)

    async def stored(self, s: Session) -> Row:
        """The task's row as stored now (a buried task's: its tombstone)."""
        if self.row is not None:
            return self.row
        if self.buried:
            (row,) = await s.fetchall(sql.SELECT_TOMBSTONE_BY_SEQ, (self.seq,))
            return row
        (row,) = await by_seq(s, [self.seq])
        return row


class MySQLLedger:
    """:class:`taskmill.settlement.CancelLedger` and
    :class:`~taskmill.settlement.Forgets` over session ``s`` at ``at``; the events it is
    given accumulate in :attr:`events` for :func:`~taskmill_mysql.events.append_events`."""

    __slots__ = ("_at", "_s", "_seqs", "events")

    def __init__(self, s: Session, at: datetime, events: list[Event] | None = None) -> None:
        self._s = s
        self._at = at
        self._seqs: dict[str, int] = {}
        self.events: list[Event] = [] if events is None else events

    @property
    def at(self) -> datetime:
        """The store clock the operation writes with (tz-aware)."""
        return as_datetime(self._at)

    def identify(self, row: Ref) -> tuple[str, TaskStatus]:
        return row.id, row.status

    def leads_aliases(self, row: Ref) -> bool:
        return row.dedupe_key is not None and settles_aliases(
            row.status, row.dedupe_key, row.alias_of
        )

    def emit(self, kind: EventKind, row: Ref) -> None:
        self.events.append((row.seq, row.id, kind.value, row.status.value, self._at))

    async def settle_aliases(self, leader: Ref) -> list[Ref]:
        s, at = self._s, self._at
        locked = await s.fetchall(sql.LOCK_ALIASES, (leader.id,))
        if not locked:
            return []
        stored = await leader.stored(s)
        s.defer(
            sql.SETTLE_ALIASES,
            (
                stored[STATUS_COL], stored[RESULT], stored[ERROR], stored[CANCEL_REASON],
                at, at, leader.id,
            ),
        )  # fmt: skip
        return [Ref.of(r) for r in await by_seq(self._s, [r[0] for r in locked])]

    async def resolve_edges(self, ended: Sequence[str]) -> list[Edge]:
        s = self._s
        edges: list[Edge] = []
        for chunk in chunks(list(ended)):
            found = await s.fetchall(sql.lock_edges(len(chunk)), chunk)
            if found:
                edges += [Edge(d, t, bool(always)) for d, t, always in found]
                s.defer(sql.delete_edges(len(chunk)), chunk)
        return edges

    async def count_down(self, dependent: str) -> tuple[Ref, int] | None:
        s = self._s
        s.defer(sql.COUNT_DOWN, (dependent,))
        found = await s.fetchone(sql.WAITING_OF, (dependent,))
        if found is None:
            return None
        seq, status, left = found
        return Ref(seq, dependent, STATUS[status], None, None), left

    async def cancel_dependent(self, dependent: Ref, error: str) -> Ref:
        args = {"now": self._at, "error": error, "seq": dependent.seq}
        self._s.defer(sql.DEPENDENCY_CANCEL, args)
        (row,) = await by_seq(self._s, [dependent.seq])
        return Ref.of(row)

    async def cancel_waiting(self, seq: int, error: str) -> Ref | None:
        """End the task ``seq``, just enqueued, cancelled by a dependency; its new ref, or
        None when it is no longer PENDING (a blocked alias its leader settled first)."""
        (row,) = await by_seq(self._s, [seq])
        if STATUS[row[STATUS_COL]] is not TaskStatus.PENDING:
            return None
        return await self.cancel_dependent(Ref.of(row), error)

    async def request_stop(self, ids: Sequence[str], reason: CancelReason) -> dict[str, Ref]:
        s = self._s
        locked = [r for r in await self._lock(ids, running_only=True) if r[7] is None]
        seqs = [r[0] for r in locked]
        for chunk in chunks(seqs):
            s.defer(
                "UPDATE tasks SET cancel_reason = %s, updated_at = %s "
                f"WHERE seq IN ({sql.marks(len(chunk))})",
                [reason.value, self._at, *chunk],
            )
        return {r[ID]: Ref.of(r) for r in await by_seq(s, seqs)}

    async def lock_active(self, ids: Sequence[str]) -> list[Active]:
        active: list[Active] = []
        for row in await self._lock(ids, running_only=False):
            seq, task_id, status, alias_of, worker_id, attempts, started_at, _ = row
            self._seqs[task_id] = seq
            started = None if started_at is None else as_datetime(started_at)
            active.append(Active(task_id, STATUS[status], alias_of, worker_id, attempts, started))
        return active

    async def _lock(self, ids: Sequence[str], *, running_only: bool) -> list[Row]:
        """(seq, id, status, alias_of, worker_id, attempts, started_at, cancel_reason) of
        the active (or RUNNING) tasks among ``ids``, locked, in seq order."""
        state = "status = 'running'" if running_only else sql.ACTIVE
        rows: list[Row] = []
        for chunk in chunks(list(ids)):
            rows += await self._s.fetchall(
                f"SELECT {_ACTIVE_COLUMNS}, cancel_reason FROM tasks "
                f"WHERE id IN ({sql.marks(len(chunk))}) AND {state} ORDER BY seq FOR UPDATE",
                chunk,
            )
        rows.sort(key=lambda r: r[0])
        return rows

    async def cancel_rows(self, ids: Sequence[str], reason: CancelReason) -> dict[str, Ref]:
        s = self._s
        seqs = [self._seqs[i] for i in ids]
        for chunk in chunks(seqs):
            named = ", ".join(f"%(s{i})s" for i in range(len(chunk)))
            s.defer(
                f"UPDATE tasks SET {sql.CANCELLATION_SET}, updated_at = %(now)s, "
                f"{sql.LEASE_CLEARED} WHERE seq IN ({named})",
                {"now": self._at, "reason": reason.value}
                | {f"s{i}": q for i, q in enumerate(chunk)},
            )
        return {r[ID]: Ref.of(r) for r in await by_seq(s, seqs)}

    async def forget(self, rows: Sequence[Ref]) -> None:
        """Delete the ended tasks ``rows`` and their execution logs, deferred after the
        finish's writes and the settlement's. A buried task's tombstone is written
        already; the others' (the aliases settled) are their rows as this transaction
        left them, copied first (:data:`~taskmill_mysql.statements.BURY`)."""
        s = self._s
        settled = [r.seq for r in rows if not r.buried]
        for chunk in chunks(settled):
            s.defer(sql.BURY.format(sql.seq_list(chunk)), (self._at,))
        for chunk in chunks([r.seq for r in rows]):
            seqs = sql.seq_list(chunk)
            s.defer(sql.FORGET_ATTEMPTS.format(seqs))
            s.defer(sql.FORGET_TASKS.format(seqs))

    async def log_attempts(self, attempts: Sequence[Attempt]) -> None:
        if attempts:
            await self._s.executemany(
                sql.INSERT_ATTEMPT,
                [attempt_row(self._seqs[a.task_id], a, as_stored) for a in attempts],
            )
