"""The SQLite backend's side of the settlement engine (:mod:`taskmill.settlement`): the
statements that lock, read and write rows inside one ``BEGIN IMMEDIATE`` transaction,
and the event writer every operation appends with.

Its methods are coroutines that never suspend (the connection is synchronous), so the
operations run the engine with :func:`taskmill.migrations.run_sync`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Final, TypeVar

from taskmill.backends.sqlite import statements as sql
from taskmill.backends.sqlite.rows import (
    CANCEL_REASON,
    ERROR,
    ID,
    RESULT,
    SEQ,
    STATUS_COL,
    Row,
    as_datetime,
    as_micros,
)
from taskmill.model import Attempt, CancelReason, EventKind, TaskStatus
from taskmill.settlement import Active, Edge
from taskmill.sql.rows import STATUS, attempt_row, leads_aliases

__all__ = ["SQLiteLedger", "chunks", "insert_events"]

T = TypeVar("T")

_ACTIVE_COLUMNS: Final = "seq, id, status, alias_of, worker_id, attempts, started_at"


def chunks(items: Sequence[T]) -> list[Sequence[T]]:
    """``items`` in slices of at most :data:`~taskmill.backends.sqlite.statements.CHUNK`
    (SQLite's bound-parameter limit)."""
    return [items[i : i + sql.CHUNK] for i in range(0, len(items), sql.CHUNK)]


def insert_events(conn: sqlite3.Connection, events: list[Row]) -> None:
    """Append ``events`` (task_seq, task_id, kind, status, at), in order.

    A batch is one multi-row statement per 128 events rather than ``executemany``,
    which runs the statement (and the AUTOINCREMENT bookkeeping in sqlite_sequence)
    once per row: this is on the claim and finish paths, two events per task. Sizes
    are rounded up to a multiple of 8 (at most 23 distinct statements): padding to a
    power of two, as the finishes do, made a batch of 100 events cost 40% more.
    """
    if not events:
        return
    if len(events) == 1:
        conn.execute(sql.INSERT_EVENT, events[0])
        return
    for start in range(0, len(events), sql.EVENT_CHUNK):
        chunk = events[start : start + sql.EVENT_CHUNK]
        size = len(chunk) if len(chunk) <= 8 else -(-len(chunk) // 8) * 8
        params: list[Any] = []
        for one in chunk:
            params += one
        for _ in range(size - len(chunk)):
            params += sql.EVENT_PAD
        conn.execute(sql.events_sql(size), params)


class SQLiteLedger:
    """:class:`taskmill.settlement.CancelLedger` over one connection in a write
    transaction at ``now`` (integer microseconds); the events it is given accumulate in
    :attr:`events` for the operation to write with :func:`insert_events`."""

    __slots__ = ("_conn", "_now", "_seqs", "buried", "events", "forgotten")

    def __init__(self, conn: sqlite3.Connection, now: int, events: list[Row] | None = None) -> None:
        self._conn = conn
        self._now = now
        self._seqs: dict[str, int] = {}
        self.events: list[Row] = [] if events is None else events
        self.forgotten: set[int] = set()
        """The seqs of the tasks :meth:`forget` deleted (their attempts are not logged)."""
        self.buried: set[int] = set()
        """The seqs of the tasks whose finish wrote their tombstones instead of updating
        them (:func:`~taskmill.backends.sqlite.statements.bury_sql`): :meth:`forget`
        deletes their rows without copying them."""

    async def forget(self, rows: Sequence[Row]) -> None:
        conn = self._conn
        seqs = [row[SEQ] for row in rows]
        self.forgotten.update(seqs)
        buried = self.buried
        copied = [seq for seq in seqs if seq not in buried] if buried else seqs
        for chunk in chunks(copied):
            conn.execute(sql.tombstones_sql(len(chunk)), [self._now, *chunk])
        for chunk in chunks(seqs):
            marks = sql.marks(len(chunk))
            conn.execute(f"DELETE FROM attempts WHERE task_seq IN ({marks})", chunk)
            conn.execute(f"DELETE FROM tasks WHERE seq IN ({marks})", chunk)

    def identify(self, row: Row) -> tuple[str, TaskStatus]:
        return row[ID], STATUS[row[STATUS_COL]]

    def leads_aliases(self, row: Row) -> bool:
        return leads_aliases(row)

    def emit(self, kind: EventKind, row: Row) -> None:
        self.events.append((row[SEQ], row[ID], kind.value, row[STATUS_COL], self._now))

    async def settle_aliases(self, leader: Row) -> list[Row]:
        now = self._now
        rows = self._conn.execute(
            sql.SETTLE_ALIASES,
            (
                leader[STATUS_COL], leader[RESULT], leader[ERROR], leader[CANCEL_REASON],
                now, now, leader[ID],
            ),
        ).fetchall()  # fmt: skip
        rows.sort(key=lambda r: r[SEQ])
        return rows

    async def resolve_edges(self, ended: Sequence[str]) -> list[Edge]:
        edges: list[Edge] = []
        for chunk in chunks(ended):
            for dependency, dependent, always in self._conn.execute(
                sql.resolve_edges_sql(len(chunk)), chunk
            ):
                edges.append(Edge(dependency, dependent, bool(always)))
        return edges

    async def count_down(self, dependent: str) -> tuple[Row, int] | None:
        found = self._conn.execute(sql.COUNT_DOWN, (dependent,)).fetchone()
        return None if found is None else (found[:-1], found[-1])

    async def cancel_dependent(self, dependent: Row, error: str) -> Row:
        row = self.cancel_waiting(dependent[ID], error)
        assert row is not None  # the engine cancels PENDING dependents only
        return row

    def cancel_waiting(self, task_id: str, error: str) -> Row | None:
        """End the task ``task_id`` cancelled by a dependency; its new row, or None when
        it is no longer PENDING."""
        row: Row | None = self._conn.execute(
            sql.DEPENDENCY_CANCEL, (self._now, error, task_id)
        ).fetchone()
        return row

    async def request_stop(self, ids: Sequence[str], reason: CancelReason) -> dict[str, Row]:
        rows: dict[str, Row] = {}
        for chunk in chunks(ids):
            params = [reason.value, self._now, *chunk]
            for row in self._conn.execute(sql.request_stop_sql(len(chunk)), params):
                rows[row[ID]] = row
        return rows

    async def lock_active(self, ids: Sequence[str]) -> list[Active]:
        # The BEGIN IMMEDIATE transaction holds the database's one writer lock.
        found: list[Row] = []
        for chunk in chunks(ids):
            found += self._conn.execute(
                f"SELECT {_ACTIVE_COLUMNS} FROM tasks "
                f"WHERE id IN ({sql.marks(len(chunk))}) AND status IN ('pending', 'running')",
                chunk,
            ).fetchall()
        found.sort(key=lambda r: r[0])
        active: list[Active] = []
        for seq, task_id, status, alias_of, worker_id, attempts, started_at in found:
            self._seqs[task_id] = seq
            started = None if started_at is None else as_datetime(started_at)
            active.append(Active(task_id, STATUS[status], alias_of, worker_id, attempts, started))
        return active

    async def cancel_rows(self, ids: Sequence[str], reason: CancelReason) -> dict[str, Row]:
        rows: dict[str, Row] = {}
        for chunk in chunks(ids):
            for row in self._conn.execute(
                sql.cancel_sql(len(chunk)), [reason.value, self._now, *chunk]
            ):
                rows[row[ID]] = row
        return rows

    async def log_attempts(self, attempts: Sequence[Attempt]) -> None:
        if attempts:
            self._conn.executemany(
                sql.INSERT_ATTEMPT,
                [attempt_row(self._seqs[a.task_id], a, as_micros) for a in attempts],
            )
