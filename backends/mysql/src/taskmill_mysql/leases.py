"""A running task's lease: renewing it, watching it for a stop request, progress
written under it, and rescuing the tasks whose lease expired.

Every write here is fenced by the lease (id, RUNNING, worker id, attempt) on the
locked row; a rescue takes back expired rows with ``SKIP LOCKED``, so each is rescued
once, and decides its transition with the kernel (:func:`~taskmill.lifecycle.rescue_case`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Final

from taskmill.lifecycle import RESCUE_ERROR, RESCUES, Transition, rescue_case
from taskmill.model import CancelReason, EventKind, Task
from taskmill.serialization import dumps
from taskmill.settlement import Settlement
from taskmill.sql.rows import REASON
from taskmill.storage import LEASED_STATUS, Lease, ProgressUpdate

from taskmill_mysql import statements as sql
from taskmill_mysql.connection import Session
from taskmill_mysql.events import Event, append_events
from taskmill_mysql.ledger import MySQLLedger, Ref
from taskmill_mysql.packets import chunks
from taskmill_mysql.readback import by_seq, now
from taskmill_mysql.rows import SEQ, Row, task

__all__ = ["renew", "rescue", "save_progress", "watch"]

_PROGRESS: Final = EventKind.PROGRESS.value


async def _lock_running(s: Session, ids: Sequence[str]) -> dict[str, Row]:
    """The RUNNING rows among ``ids`` (seq, id, worker_id, attempts, cancel_reason),
    locked, by id."""
    found: dict[str, Row] = {}
    for chunk in chunks(list(dict.fromkeys(ids))):
        for row in await s.fetchall(sql.LOCK_RUNNING.format(sql.marks(len(chunk))), chunk):
            found[row[1]] = row
    return found


def _held(row: Row | None, lease: Lease) -> bool:
    # LOCK_RUNNING selects RUNNING rows only.
    return row is not None and lease.holds(row[1], LEASED_STATUS, row[2], row[3])


async def renew(s: Session, args: tuple[Sequence[Lease], float]) -> dict[str, CancelReason | None]:
    leases, lease_seconds = args
    at = await now(s)
    locked = await _lock_running(s, [x.task_id for x in leases])
    held: dict[str, CancelReason | None] = {}
    seqs: list[int] = []
    for lease in leases:
        row = locked.get(lease.task_id)
        if _held(row, lease) and lease.task_id not in held:
            assert row is not None
            held[lease.task_id] = None if row[4] is None else REASON[row[4]]
            seqs.append(row[0])
    until = at + timedelta(seconds=lease_seconds)
    for chunk in chunks(seqs):
        s.defer(sql.RENEW.format(sql.marks(len(chunk))), [until, *chunk])
    return held


async def save_progress(s: Session, updates: Sequence[ProgressUpdate]) -> set[str]:
    at = await now(s)
    locked = await _lock_running(s, [u.lease.task_id for u in updates])
    written: set[str] = set()
    events: list[Event] = []
    for update in updates:
        row = locked.get(update.lease.task_id)
        if not _held(row, update.lease):
            continue
        assert row is not None
        args: list[Any] = [at]
        progress = update.progress
        if progress is not None:
            args += (progress.done, progress.total, progress.message)
        if update.data is not None:
            args.append(dumps(update.data))
        args.append(row[0])
        text = sql.PROGRESS_SQL[progress is not None, update.data is not None]
        s.defer(text, args)
        written.add(update.lease.task_id)
        events.append((row[0], update.lease.task_id, _PROGRESS, "running", at))
    await append_events(s, events)
    return written


def _outcome(transition: Transition) -> str:
    assert transition.outcome is not None  # every rescue logs its own outcome
    return transition.outcome.value


async def rescue(s: Session, limit: int) -> list[Task]:
    at = await now(s)
    expired = await s.fetchall(sql.RESCUE_SELECT, (at, limit))
    if not expired:
        return []
    transitions: dict[int, Transition] = {}
    for seq, _, _, attempts, max_retries, _, reason in expired:
        case = rescue_case(None if reason is None else REASON[reason], attempts, max_retries)
        transitions[seq] = RESCUES[case]
        s.defer(sql.RESCUE[case], {"now": at, "seq": seq})
    rows = {r[SEQ]: r for r in await by_seq(s, list(transitions))}
    rescued: list[Task] = []
    log: list[Row] = []
    ledger = MySQLLedger(s, at)
    settlement = Settlement(ledger)
    for seq, task_id, worker_id, attempts, _, started_at, _ in expired:
        row = rows[seq]
        transition = transitions[seq]
        await settlement.transitioned(Ref.of(row), transition.event)
        log.append(
            (
                seq, task_id, attempts, worker_id or "", at if started_at is None else started_at,
                at, _outcome(transition), RESCUE_ERROR,
            )
        )  # fmt: skip
        rescued.append(task(row))
    if settlement.pending:
        await settlement.dependents()
    await s.executemany(sql.INSERT_ATTEMPT, log)
    await append_events(s, ledger.events)
    return rescued


async def watch(s: Session, leases: Sequence[Lease]) -> dict[str, CancelReason | None]:
    found: dict[str, Row] = {}
    for chunk in chunks([x.task_id for x in leases]):
        text = (
            "SELECT id, id, worker_id, attempts, cancel_reason FROM tasks "
            f"WHERE id IN ({sql.marks(len(chunk))}) AND status = 'running'"
        )
        for row in await s.fetchall(text, chunk):
            found[row[0]] = row
    held: dict[str, CancelReason | None] = {}
    for lease in leases:
        held_row = found.get(lease.task_id)
        if held_row is not None and _held(held_row, lease):
            held[lease.task_id] = None if held_row[4] is None else REASON[held_row[4]]
    return held
