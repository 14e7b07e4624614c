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

from taskmill.lifecycle import CANCELLATION, cancel_error, cancel_targets
from taskmill.model import CancelReason, EventKind, SuspensionScope, Task, TaskFilter
from taskmill.sql.rows import leads_aliases

from taskmill_mysql import statements as sql
from taskmill_mysql.connection import Session
from taskmill_mysql.events import Event, append_events
from taskmill_mysql.packets import chunks
from taskmill_mysql.readback import by_seq, now
from taskmill_mysql.rows import ID, SEQ, STATUS_COL, Row, task
from taskmill_mysql.settlement import settle_aliases, settle_dependents

__all__ = ["cancel", "resume", "suspend", "suspensions"]

_CANCEL_REQUESTED: Final = EventKind.CANCEL_REQUESTED.value
_CANCELLED_EVENT: Final = CANCELLATION.event.value
assert CANCELLATION.outcome is not None
_CANCELLED_OUTCOME: Final = CANCELLATION.outcome.value


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


async def _lock_active(s: Session, ids: Sequence[str], *, running_only: bool) -> list[Row]:
    """(seq, id, status, worker_id, attempts, started_at, alias_of, cancel_reason) of the
    active (or RUNNING) tasks among ``ids``, locked, in seq order."""
    state = "status = 'running'" if running_only else sql.ACTIVE
    rows: list[Row] = []
    for chunk in chunks(ids):
        rows += await s.fetchall(
            "SELECT seq, id, status, worker_id, attempts, started_at, alias_of, cancel_reason "
            f"FROM tasks WHERE id IN ({sql.marks(len(chunk))}) AND {state} ORDER BY seq FOR UPDATE",
            chunk,
        )
    rows.sort(key=lambda r: r[0])
    return rows


async def cancel(
    s: Session, args: tuple[Sequence[str] | None, TaskFilter | None, CancelReason, bool]
) -> list[Task]:
    task_ids, filter, reason, cascade = args
    targets = await _cancel_targets(s, task_ids, filter, cascade)
    at = await now(s)
    events: list[Event] = []
    if not reason.terminal:
        # SUSPENDED, SHUTDOWN: only a running task without a request yet is asked to stop.
        asked = [r for r in await _lock_active(s, targets, running_only=True) if r[7] is None]
        seqs = [r[0] for r in asked]
        for chunk in chunks(seqs):
            s.defer(
                "UPDATE tasks SET cancel_reason = %s, updated_at = %s "
                f"WHERE seq IN ({sql.marks(len(chunk))})",
                [reason.value, at, *chunk],
            )
        by_id = {r[ID]: r for r in await by_seq(s, seqs)}
        changed = [by_id[i] for i in targets if i in by_id]
        events += [(r[SEQ], r[ID], _CANCEL_REQUESTED, "running", at) for r in changed]
        await append_events(s, events)
        return [task(r) for r in changed]

    # A terminal reason: every selected active task ends CANCELLED, processed as if one
    # by one in `targets` order.
    position = {task_id: n for n, task_id in enumerate(targets)}
    active = await _lock_active(s, targets, running_only=False)
    # An alias whose (active) leader comes before it is cancelled *by* that leader,
    # taking its result and error as aliases always do; otherwise it is cancelled alone.
    first = {r[1]: position[r[1]] for r in active}
    direct = [r[0] for r in active if first.get(r[6], len(targets)) > position[r[1]]]
    for chunk in chunks(direct):
        named = ", ".join(f"%(s{i})s" for i in range(len(chunk)))
        s.defer(
            f"UPDATE tasks SET {sql.CANCELLATION_SET}, updated_at = %(now)s, "
            f"{sql.LEASE_CLEARED} WHERE seq IN ({named})",
            {"now": at, "reason": reason.value, **{f"s{i}": q for i, q in enumerate(chunk)}},
        )
    rows = {r[ID]: r for r in await by_seq(s, direct)}
    cancelled: list[Row] = []
    done: set[str] = set()
    for task_id in targets:
        row = rows.get(task_id)
        if row is None or task_id in done:
            continue
        done.add(task_id)
        cancelled.append(row)
        events.append((row[SEQ], task_id, _CANCELLED_EVENT, "cancelled", at))
        if leads_aliases(row):
            for alias in await settle_aliases(s, row, at, events):
                done.add(alias[ID])
                cancelled.append(alias)
    error = cancel_error(reason)
    log = [
        (
            seq, task_id, attempts_, worker_id or "", at if started_at is None else started_at,
            at, _CANCELLED_OUTCOME, error,
        )
        for seq, task_id, status, worker_id, attempts_, started_at, _, _ in active
        if status == "running"
    ]  # fmt: skip
    await s.executemany(sql.INSERT_ATTEMPT, log)
    if cancelled:
        ended = [(r[ID], r[STATUS_COL]) for r in cancelled]
        cancelled += await settle_dependents(s, ended, at, events)
    await append_events(s, events)
    return [task(r) for r in cancelled]


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
