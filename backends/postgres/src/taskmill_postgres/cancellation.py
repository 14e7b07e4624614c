"""A cancel, in the one transaction :meth:`PostgresStorage.cancel
<taskmill_postgres.storage.PostgresStorage.cancel>` runs it in: which tasks it selects,
asking running ones to stop (a non-terminal reason), or ending them CANCELLED with
their aliases and dependents settled (a terminal one).

The decisions are the lifecycle kernel's (:func:`~taskmill.lifecycle.cancel_targets`,
:func:`~taskmill.lifecycle.settles_aliases`), the sequence the settlement engine's
(:func:`taskmill.settlement.cancel`) over :class:`PostgresLedger`; dependents are
settled by the schema's ``settle_dependents`` function.
"""

from __future__ import annotations

from collections.abc import Sequence

from taskmill.lifecycle import cancel_targets, settles_aliases
from taskmill.model import Attempt, CancelReason, EventKind, Task, TaskFilter, TaskStatus
from taskmill.settlement import Active
from taskmill.settlement import cancel as settlement_cancel
from taskmill.storage import StoreChange, utcnow

from taskmill_postgres import rows
from taskmill_postgres.connection import Record
from taskmill_postgres.events import EventLog, Events
from taskmill_postgres.schema import Conn
from taskmill_postgres.statements import Statements, filter_sql

__all__ = ["Cancellation", "PostgresLedger", "settle_aliases"]


class Cancellation:
    """The cancel of one schema, run inside a transaction the caller opened."""

    __slots__ = ("log", "sql")

    def __init__(self, sql: Statements, log: EventLog) -> None:
        self.sql = sql
        self.log = log

    async def cancel(
        self,
        conn: Conn,
        task_ids: Sequence[str] | None,
        filter: TaskFilter | None,
        reason: CancelReason,
        cascade: bool,
    ) -> list[Task]:
        """Cancel (terminal ``reason``) or ask to stop (SUSPENDED, SHUTDOWN) the active
        tasks selected by ``task_ids`` and/or ``filter``, their descendants when
        ``cascade``, and a cancelled leader's aliases.

        :returns: every changed task: the selection and its descendants in that order,
            each cancelled leader followed by its aliases.
        """
        targets = await self._targets(conn, task_ids, filter, cascade)
        if not targets:
            return []
        ledger = PostgresLedger(conn, self.sql, self.log)
        changed = await settlement_cancel(ledger, targets, reason, utcnow())
        changes = [StoreChange.CONTROL] if ledger.stopped_running else []
        await self.log.append(conn, ledger.events, changes)
        return [rows.task(r) for r in changed]

    async def _targets(
        self,
        conn: Conn,
        task_ids: Sequence[str] | None,
        filter: TaskFilter | None,
        cascade: bool,
    ) -> list[str]:
        """The ids a cancel applies to, in the reference store's order: those named, the
        active tasks ``filter`` selects (in creation order), then breadth first their
        descendants (each task's children in creation order)."""
        order: dict[str, None] = dict.fromkeys(task_ids or ())
        if filter is not None:
            where, args = filter_sql(filter)
            found = await conn.fetch(
                f"SELECT id FROM {self.sql.quoted}.tasks WHERE ({where}) "
                "AND status IN ('pending', 'running') ORDER BY seq",
                *args,
            )
            order.update((r[0], None) for r in found)

        async def children_of(level: list[str]) -> list[tuple[str, str]]:
            return [(r[0], r[1]) for r in await conn.fetch(self.sql.children, level)]

        return await cancel_targets(order, children_of if cascade else None)


class PostgresLedger:
    """:class:`taskmill.settlement.ServerSideCancelLedger` over one connection in a
    transaction: a cancel's writes, with dependents settled by the schema's
    ``settle_dependents`` function (held to the engine by the shipped differential test).
    The events accumulate in :attr:`events` for :meth:`EventLog.append`."""

    __slots__ = ("_conn", "_log", "_seqs", "_sql", "events", "stopped_running")

    def __init__(self, conn: Conn, sql: Statements, log: EventLog) -> None:
        self._conn = conn
        self._sql = sql
        self._log = log
        self._seqs: dict[str, int] = {}
        self.events = Events()
        self.stopped_running = False
        """Whether a RUNNING task was asked to stop or ended (its worker must learn)."""

    def identify(self, row: Record) -> tuple[str, TaskStatus]:
        return row[rows.ID], rows.STATUS[row[rows.STATUS_COL]]

    def leads_aliases(self, row: Record) -> bool:
        return settles_aliases(
            rows.STATUS[row[rows.STATUS_COL]], row[rows.DEDUPE_KEY], row[rows.ALIAS_OF]
        )

    def emit(self, kind: EventKind, row: Record) -> None:
        self.events.add(row[rows.SEQ], kind.value, row[rows.STATUS_COL])

    async def settle_aliases(self, leader: Record) -> list[Record]:
        settled = await settle_aliases(self._conn, self._sql, [leader])
        return settled.get(leader[rows.SEQ], [])

    async def settle_dependents(self, ended: Sequence[Record]) -> list[Record]:
        seqs = await self._conn.fetchval(
            self._sql.settle_dependents, [r[rows.SEQ] for r in ended], self._log.lock,
            self._log.channel,
        )  # fmt: skip
        if not seqs:
            return []
        found = await self._conn.fetch(self._sql.by_seq, list(seqs))
        return sorted(found, key=lambda r: r[rows.SEQ])

    async def request_stop(self, ids: Sequence[str], reason: CancelReason) -> dict[str, Record]:
        found = await self._conn.fetch(self._sql.request_stop, reason.value, list(ids))
        self.stopped_running = True
        return {r[rows.ID]: r for r in found}

    async def lock_active(self, ids: Sequence[str]) -> list[Active]:
        active: list[Active] = []
        for r in await self._conn.fetch(self._sql.lock_active, list(ids)):
            self._seqs[r["id"]] = r["seq"]
            status = rows.STATUS[r["status"]]
            self.stopped_running |= status is TaskStatus.RUNNING
            active.append(
                Active(
                    r["id"], status, r["alias_of"], r["worker_id"], r["attempts"], r["started_at"]
                )
            )
        return active

    async def cancel_rows(self, ids: Sequence[str], reason: CancelReason) -> dict[str, Record]:
        found = await self._conn.fetch(self._sql.cancel, reason.value, list(ids))
        return {r[rows.ID]: r for r in found}

    async def log_attempts(self, attempts: Sequence[Attempt]) -> None:
        if attempts:
            await self._conn.execute(
                self._sql.log_cancelled,
                [self._seqs[a.task_id] for a in attempts],
                [a.number for a in attempts],
                [a.worker_id for a in attempts],
                [a.started_at for a in attempts],
                attempts[0].error,
            )


async def settle_aliases(
    conn: Conn, sql: Statements, leaders: Sequence[Record]
) -> dict[int, list[Record]]:
    """Give the pending aliases of ``leaders`` (terminal leaders with a dedupe key)
    their leader's outcome (the ``settle_aliases`` function), after the leaders'
    update in the same transaction.

    :returns: the aliases' new rows by leader seq, in creation order.
    """
    by_leader: dict[int, list[Record]] = {}
    if not leaders:
        return by_leader
    settled = await conn.fetch(sql.settle_aliases, [r[rows.SEQ] for r in leaders])
    if settled:
        found = await conn.fetch(sql.by_seq, [r[0] for r in settled])
        leader_of = {r[0]: r[1] for r in settled}
        for row in sorted(found, key=lambda r: r[rows.SEQ]):
            by_leader.setdefault(leader_of[row[rows.SEQ]], []).append(row)
    return by_leader
