"""A cancel and a suspension, each in one transaction: which tasks a cancel selects,
asking running ones to stop (a non-terminal reason, or a suspension), or ending them
CANCELLED with their aliases and dependents settled (a terminal reason).

The decisions are the lifecycle kernel's (:func:`~taskmill.lifecycle.cancel_targets`,
:func:`~taskmill.lifecycle.cancel_error`). A suspension takes the claim gate
exclusively, so a claim either sees the suspension or the suspension's scan of RUNNING
tasks sees what the claim took (0001_initial.sql).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from taskmill.lifecycle import cancel_targets
from taskmill.model import CancelReason, EventKind, SuspensionScope, Task, TaskFilter
from taskmill.settlement import cancel as settlement_cancel

from taskmill_mysql import statements as sql
from taskmill_mysql.connection import Session
from taskmill_mysql.events import append_events
from taskmill_mysql.ledger import MySQLLedger
from taskmill_mysql.packets import chunks
from taskmill_mysql.readback import now
from taskmill_mysql.rows import task

__all__ = ["cancel", "resume", "suspend", "suspensions"]

_CANCEL_REQUESTED: Final = EventKind.CANCEL_REQUESTED.value


async def _cancel_targets(
    s: Session, task_ids: Sequence[str] | None, filter: TaskFilter | None, cascade: bool
) -> list[str]:
    """The ids a cancel applies to, in the reference store's order: those named, the
    active tasks ``filter`` selects (in creation order), then breadth first their
    descendants (each task's children in creation order)."""
    selected: dict[str, None] = dict.fromkeys(task_ids or ())
    if filter is not None:
        chosen = sql.filter_sql(filter)
        where = f"{chosen.where} AND {sql.ACTIVE}" if chosen.clauses else f" WHERE {sql.ACTIVE}"
        found = await s.fetchall(f"SELECT id FROM tasks{where} ORDER BY seq", chosen.args)
        selected.update((row[0], None) for row in found)

    async def children_of(level: list[str]) -> list[tuple[str, str]]:
        pairs: list[tuple[str, str]] = []
        for chunk in chunks(level):
            text = (
                f"SELECT id, parent_id FROM tasks WHERE parent_id IN ({sql.marks(len(chunk))}) "
                "ORDER BY seq"
            )
            pairs += [(r[0], r[1]) for r in await s.fetchall(text, chunk)]
        return pairs

    return await cancel_targets(selected, children_of if cascade else None)


async def cancel(
    s: Session, args: tuple[Sequence[str] | None, TaskFilter | None, CancelReason, bool]
) -> list[Task]:
    task_ids, filter, reason, cascade = args
    targets = await _cancel_targets(s, task_ids, filter, cascade)
    ledger = MySQLLedger(s, await now(s))
    changed = await settlement_cancel(ledger, targets, reason, ledger.at)
    await append_events(s, ledger.events)
    return [task(await r.stored(s)) for r in changed]


async def suspend(s: Session, scope: SuspensionScope) -> int:
    await s.execute(sql.CLAIM_GATE_EXCLUSIVE)
    at = await now(s)
    s.defer(sql.SUSPEND, (scope.task_type, scope.app_id, at))
    where = "status = 'running' AND cancel_reason IS NULL"
    params: list[Any] = []
    if scope.task_type is not None:
        where += " AND task_type = %s"
        params.append(scope.task_type)
    if scope.app_id is not None:
        where += " AND app_id = %s"
        params.append(scope.app_id)
    asked = await s.fetchall(
        f"SELECT seq, id FROM tasks WHERE {where} ORDER BY seq FOR UPDATE", params
    )
    for chunk in chunks([r[0] for r in asked]):
        s.defer(
            "UPDATE tasks SET cancel_reason = 'suspended', updated_at = %s "
            f"WHERE seq IN ({sql.marks(len(chunk))})",
            [at, *chunk],
        )
    await append_events(s, [(seq, i, _CANCEL_REQUESTED, "running", at) for seq, i in asked])
    return len(asked)


async def resume(s: Session, scope: SuspensionScope) -> bool:
    return await s.execute(sql.RESUME, (scope.task_type, scope.app_id)) > 0


async def suspensions(s: Session, _: None) -> list[SuspensionScope]:
    scopes = [SuspensionScope(task_type=t, app_id=a) for t, a in await s.fetchall(sql.SUSPENSIONS)]
    scopes.sort(key=lambda x: (x.task_type or "", x.app_id or ""))
    return scopes
