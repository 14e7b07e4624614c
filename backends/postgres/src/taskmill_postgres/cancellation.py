"""A cancel, in the one transaction :meth:`PostgresStorage.cancel
<taskmill_postgres.storage.PostgresStorage.cancel>` runs it in: which tasks it selects,
asking running ones to stop (a non-terminal reason), or ending them CANCELLED with
their aliases and dependents settled (a terminal one).

The decisions are the lifecycle kernel's (:func:`~taskmill.lifecycle.cancel_targets`,
:func:`~taskmill.lifecycle.settles_aliases`, :func:`~taskmill.lifecycle.cancel_error`);
dependents are settled by the schema's ``settle_dependents`` function.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from taskmill.lifecycle import CANCELLATION, cancel_error, cancel_targets, settles_aliases
from taskmill.model import CancelReason, EventKind, Task, TaskFilter
from taskmill.storage import StoreChange

from taskmill_postgres import rows
from taskmill_postgres.connection import Record
from taskmill_postgres.events import EventLog, Events
from taskmill_postgres.schema import Conn
from taskmill_postgres.statements import Statements, filter_sql

__all__ = ["Cancellation"]

_CANCELLED: Final = CANCELLATION.event.value
_CANCEL_REQUESTED: Final = EventKind.CANCEL_REQUESTED.value


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
        if not reason.terminal:
            return await self._request_stop(conn, targets, reason)
        return await self._cancel(conn, targets, reason)

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

    async def _request_stop(
        self, conn: Conn, targets: list[str], reason: CancelReason
    ) -> list[Task]:
        """SUSPENDED, SHUTDOWN: a running task without a request yet is asked to stop."""
        found = {
            r[rows.ID]: r for r in await conn.fetch(self.sql.request_stop, reason.value, targets)
        }
        changed = [found[i] for i in targets if i in found]
        events = Events()
        for row in changed:
            events.add(row[rows.SEQ], _CANCEL_REQUESTED, "running")
        await self.log.append(conn, events, [StoreChange.CONTROL])
        return [rows.task(r) for r in changed]

    async def _cancel(self, conn: Conn, targets: list[str], reason: CancelReason) -> list[Task]:
        """A terminal reason: every selected active task ends CANCELLED, as if one by
        one in ``targets`` order."""
        position = {task_id: n for n, task_id in enumerate(targets)}
        active = await conn.fetch(self.sql.lock_active, targets)
        # An alias whose (active) leader comes before it is cancelled *by* that leader,
        # taking its outcome as aliases always do; otherwise it is cancelled alone.
        first = {r["id"]: position[r["id"]] for r in active}
        direct = [
            r["id"] for r in active if first.get(r["alias_of"], len(targets)) > position[r["id"]]
        ]
        cancelled = {r[rows.ID]: r for r in await conn.fetch(self.sql.cancel, reason.value, direct)}
        leaders = [
            r
            for r in cancelled.values()
            if settles_aliases(
                rows.STATUS[r[rows.STATUS_COL]], r[rows.DEDUPE_KEY], r[rows.ALIAS_OF]
            )
        ]
        events = Events()
        aliases = await settle_aliases(conn, self.sql, leaders)
        changed: list[Record] = []
        done: set[str] = set()
        for task_id in targets:
            row = cancelled.get(task_id)
            if row is None or task_id in done:
                continue
            done.add(task_id)
            changed.append(row)
            events.add(row[rows.SEQ], _CANCELLED, "cancelled")
            for alias in aliases.get(row[rows.SEQ], ()):
                done.add(alias[rows.ID])
                changed.append(alias)
                events.add(alias[rows.SEQ], _CANCELLED, "cancelled")
        if changed:
            seqs = await conn.fetchval(
                self.sql.settle_dependents,
                [r[rows.SEQ] for r in changed],
                self.log.lock,
                self.log.channel,
            )
            if seqs:
                changed += sorted(
                    await conn.fetch(self.sql.by_seq, list(seqs)), key=lambda r: r[rows.SEQ]
                )
        running = [r for r in active if r["status"] == "running"]
        if running:
            await conn.execute(
                self.sql.log_cancelled,
                [r["seq"] for r in running],
                [r["attempts"] for r in running],
                [r["worker_id"] or "" for r in running],
                [r["started_at"] for r in running],
                cancel_error(reason),
            )
        await self.log.append(conn, events, [StoreChange.CONTROL] if running else [])
        return [rows.task(r) for r in changed]


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
