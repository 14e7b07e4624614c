"""Finishing attempts: a batch of finishes applied in one transaction, each fenced by
(id, RUNNING, worker id, attempt) on its locked row, with the execution log, the
aliases and dependents its end settles, and its events.

Finishes of the same kind are written together
(:func:`~taskmill_mysql.statements.finish_sql`, up to 128 rows a statement, fewer to fit
a packet); the finished snapshot is the kernel's transition applied to the locked row
(:func:`_finished`), not a read back.

A finish with ``delete`` that ends its task COMPLETED or FAILED writes, instead of the
``UPDATE``, the row the ``UPDATE`` would leave to ``tombstones`` (the same batch of
values joined to the locked rows, :func:`~taskmill_mysql.statements.bury_sql`), logs no
attempt, and leaves the task row as it is until the settlement, once the aliases and
dependents are settled, deletes it with the aliases it settled and their logs
(:meth:`~taskmill_mysql.ledger.MySQLLedger.forget`): a row about to be deleted is not
updated first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from taskmill.lifecycle import (
    DEFAULT_CANCEL_REASON,
    FINISHES,
    finish_kind,
    finish_rounds,
    plan,
)
from taskmill.model import NO_PROGRESS, AttemptOutcome, Progress, Task
from taskmill.serialization import dumps, loads
from taskmill.settlement import Settlement
from taskmill.storage import LEASED_STATUS, Finish, FinishKind, Lease

from taskmill_mysql import statements as sql
from taskmill_mysql.connection import Session
from taskmill_mysql.events import QUOTED, Event, append_events
from taskmill_mysql.ledger import MySQLLedger, Ref
from taskmill_mysql.packets import chunks, text_bytes
from taskmill_mysql.readback import snapshot_rows
from taskmill_mysql.rows import (
    NARROW_FENCE,
    SNAPSHOT_FENCE,
    Row,
    as_datetime,
    as_stored,
    fence_from_json,
    task,
)
from taskmill_mysql.statements import BURIED

__all__ = ["finish", "finish_applied"]

_COMPLETED: Final = AttemptOutcome.COMPLETED.value
_APPLIED: Final = {
    kind: (t.event, None if t.outcome is None else t.outcome.value) for kind, t in FINISHES.items()
}
"""Per finish kind: its event, and the outcome it logs (None: the worker's)."""
Literal = Callable[[Any], str]
""":meth:`Session.literal`."""


def _finish_literals(literal: Literal, finish: Finish, seq: int, at: datetime) -> list[str]:
    """One finish's row of the batch (statements.FINISH_COLUMNS), as SQL literals."""
    progress = finish.progress
    reason = "NULL"
    if finish.kind is FinishKind.CANCEL:
        reason = literal((finish.cancel_reason or DEFAULT_CANCEL_REASON).value)
    retry_in = finish.retry_in
    result, error, data = finish.result_json, finish.error, finish.data
    return [
        str(int(seq)),
        literal(at + timedelta(seconds=retry_in) if retry_in else at),
        "NULL" if result is None else literal(result),
        "NULL" if error is None else literal(error),
        reason,
        "NULL" if data is None else literal(dumps(data)),
        *(
            ("0", "NULL", "NULL", "NULL")
            if progress is None
            else ("1", literal(progress.done), literal(progress.total), literal(progress.message))
        ),
    ]


def _apply_finishes(s: Session, at: datetime, kind: FinishKind, rows: list[list[str]]) -> None:
    """The batched finish statement of ``kind`` over ``rows``: 128 at a time, fewer
    when their values would take a statement past the packet."""
    now = s.literal(at)
    sizes = [sum([text_bytes(value) for value in row]) + sql.FINISH_ROW_BYTES for row in rows]
    for start, stop, _ in s.runs(sql.finish_bytes(kind, now), sizes, most=128):
        s.defer(sql.finish_sql(kind, rows[start:stop], now))


def _attempt_literals(
    literal: Literal, seq: int, lease: Lease, finish: Finish, outcome: str
) -> str:
    """The execution-log row of one applied finish (statements.INSERT_ATTEMPTS)."""
    error = None if outcome == _COMPLETED else finish.error
    return (
        f"({int(seq):d}, {literal(lease.task_id)}, {int(lease.attempt):d}, "
        f"{literal(lease.worker_id)}, {literal(as_stored(finish.started_at))}, "
        f"{literal(as_stored(finish.finished_at))}, {QUOTED[outcome]}, "
        f"{'NULL' if error is None else literal(error)})"
    )


def _bury_finishes(s: Session, at: datetime, kind: FinishKind, rows: list[list[str]]) -> None:
    """The finish of ``kind`` over ``rows``, finishes with ``delete`` that end their
    tasks: their tombstones as :func:`_apply_finishes` would leave their rows
    (:func:`~taskmill_mysql.statements.bury_sql`), in statements cut as it cuts its own."""
    now = s.literal(at)
    sizes = [sum([text_bytes(value) for value in row]) + sql.FINISH_ROW_BYTES for row in rows]
    for start, stop, _ in s.runs(sql.bury_bytes(kind, now), sizes, most=128):
        s.defer(sql.bury_sql(kind, rows[start:stop], now))


_FINISH_PLANS: Final = {kind: plan(t) for kind, t in FINISHES.items()}


def _finished(before: Task, one: Finish, kind: FinishKind, at: datetime) -> Task:
    """The snapshot of ``before`` after :func:`_apply_finishes` wrote ``one`` as
    ``kind`` at ``at``: the kernel's transition (:meth:`TransitionPlan.apply`) given the
    values of :func:`_finish_literals` as the row holds them once stored (JSON text
    decoded again, progress as the DOUBLE columns return it), so that it equals what
    a read back would return."""
    now = as_datetime(at)
    changes: dict[str, Any] = {}
    if one.data is not None:
        changes["data"] = loads(dumps(one.data))
    progress = one.progress
    if progress is not None:
        changes["progress"] = (
            NO_PROGRESS
            if progress.done == 0 and progress.total is None and progress.message is None
            else Progress(
                float(progress.done),
                None if progress.total is None else float(progress.total),
                progress.message,
            )
        )
    result = one.result_json
    reason = None
    if one.kind is FinishKind.CANCEL:
        reason = one.cancel_reason or DEFAULT_CANCEL_REASON
    return _FINISH_PLANS[kind].apply(
        before,
        now,
        run_later=now + timedelta(seconds=one.retry_in or 0),
        result=None if result is None or result == "null" else loads(result),
        error=one.error,
        cancel_reason=reason,
        **changes,
    )


async def finish(s: Session, finishes: Sequence[Finish]) -> list[Task | None]:
    applied = await _finish(s, finishes, snapshots=True)
    return [applied.get(index) for index in range(len(finishes))]


async def finish_applied(s: Session, finishes: Sequence[Finish]) -> list[bool]:
    applied = await _finish(s, finishes, snapshots=False)
    return [index in applied for index in range(len(finishes))]


async def _finish(
    s: Session, finishes: Sequence[Finish], *, snapshots: bool
) -> dict[int, Task | None]:
    """Apply ``finishes``; by the index of each one applied, the finished snapshot
    (None without ``snapshots``: the locking read then takes only the fence and the
    alias columns, and no snapshot is built)."""
    at: datetime | None = None
    results: dict[int, Task | None] = {}
    log: list[str] = []
    literal = s.literal
    events: list[Event] = []
    settlement: Settlement[Ref] | None = None
    lock = sql.LOCK_FINISHING if snapshots else sql.LOCK_FINISHING_FENCE
    fence = SNAPSHOT_FENCE if snapshots else NARROW_FENCE
    buried: dict[FinishKind, list[list[Any]]] = {}
    """The finishes with ``delete`` of a round that end their task, by kind."""
    gone: set[str] = set()
    """The tasks whose tombstones this call wrote."""
    i_seq, i_id, i_worker, i_attempts = fence.seq, fence.id, fence.worker_id, fence.attempts
    for indexes in finish_rounds(finishes):
        locked: dict[str, Row] = {}
        for chunk in chunks(list(dict.fromkeys(finishes[i].lease.task_id for i in indexes))):
            text = lock.format(sql.marks(len(chunk)))
            if snapshots:
                found = await snapshot_rows(s, text, chunk)
            else:
                found = [fence_from_json(r) for r in await s.fetchall(text, chunk)]
            for row in found:
                locked[row[i_id]] = row
                if at is None:
                    at = row[-1]  # the store clock, read with the locks
        if at is None:
            continue  # nothing held: nothing to write
        if settlement is None:
            settlement = Settlement(MySQLLedger(s, at, events))
        applied: dict[int, tuple[Row, FinishKind, bool]] = {}
        by_kind: dict[FinishKind, list[list[Any]]] = {}
        for index in indexes:
            one = finishes[index]
            held = locked.get(one.lease.task_id)
            # The rows locked are RUNNING ones.
            if held is None or not one.lease.holds(
                held[i_id], LEASED_STATUS, held[i_worker], held[i_attempts]
            ):
                continue
            if gone and held[i_id] in gone:
                continue  # buried by an earlier round: its row is left RUNNING until deleted
            stop_requested = held[fence.cancel_reason] is not None
            kind = finish_kind(one.kind, stop_requested=stop_requested)
            values = _finish_literals(literal, one, held[i_seq], at)
            doomed = one.delete and kind in BURIED
            if doomed:
                buried.setdefault(kind, []).append(values)
                gone.add(held[i_id])
            else:
                by_kind.setdefault(kind, []).append(values)
            applied[index] = (held, kind, doomed)
        for kind, rows in by_kind.items():
            _apply_finishes(s, at, kind, rows)
        if buried:
            for kind, rows in buried.items():
                _bury_finishes(s, at, kind, rows)
            buried = {}
        for index, (row, kind, doomed) in applied.items():
            one = finishes[index]
            after = _finished(task(row), one, kind, at) if snapshots else None
            seq = row[i_seq]
            task_id = one.lease.task_id
            status = FINISHES[kind].status
            kind_event, outcome = _APPLIED[kind]
            if doomed:
                # Its tombstone is written, its row is deleted once its aliases and
                # dependents are settled (MySQLLedger.forget), and its log goes with it.
                ref = Ref(
                    seq, task_id, status, row[fence.dedupe_key], row[fence.alias_of],
                    buried=True,
                )  # fmt: skip
                await settlement.transitioned(ref, kind_event, delete=True)
            else:
                ref = Ref(seq, task_id, status, row[fence.dedupe_key], row[fence.alias_of])
                await settlement.transitioned(ref, kind_event)
                outcome = outcome or one.outcome.value
                log.append(_attempt_literals(literal, seq, one.lease, one, outcome))
            results[index] = after
    if settlement is None:
        return results
    if settlement.pending:
        await settlement.dependents()
    if log:
        s.defer_values(sql.INSERT_ATTEMPTS, log)
    await append_events(s, events)
    return results
