"""The domain operations of the MySQL backend, as async functions of a
:class:`~taskmill_mysql.connection.Session`: one per method of the storage contract,
which :class:`~taskmill_mysql.storage.MySQLStorage` calls through this module.

Each write runs inside one short ``READ COMMITTED`` transaction (see
:meth:`~taskmill_mysql.connection.Database.run`), reads run on their own. The
operations of one concern live in a module of their own and are named here: inserting
tasks (:mod:`~taskmill_mysql.enqueue`), claims (:mod:`~taskmill_mysql.claims`),
finishes (:mod:`~taskmill_mysql.finishes`), leases, progress and rescue
(:mod:`~taskmill_mysql.leases`), cancels and suspensions
(:mod:`~taskmill_mysql.cancellation`), the event log (:mod:`~taskmill_mysql.events`),
handler registrations (:mod:`~taskmill_mysql.registrations`) and the worker registry
(:mod:`~taskmill_mysql.workers`). The reads, the cleanup and the redrive, a statement or
two each, are written here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from taskmill.errors import TaskNotFound
from taskmill.lifecycle import REDRIVE_EVENT, check_redrive, key_taken
from taskmill.model import Attempt, ProgressSummary, Task, TaskFilter, TaskStatus
from taskmill.sql.filters import page_sql
from taskmill.sql.rows import STATUS
from taskmill.storage import HandlerKey

from taskmill_mysql import statements as sql
from taskmill_mysql.cancellation import cancel, resume, suspend, suspensions
from taskmill_mysql.claims import claim
from taskmill_mysql.connection import Session
from taskmill_mysql.enqueue import enqueue
from taskmill_mysql.events import append_events, prune_events, read_events
from taskmill_mysql.finishes import finish, finish_applied
from taskmill_mysql.leases import renew, rescue, save_progress, watch
from taskmill_mysql.readback import by_seq, now, snapshot_rows
from taskmill_mysql.registrations import delete_registration, put_registration, registrations
from taskmill_mysql.rows import TASK_COLUMNS, as_datetime, attempt, task
from taskmill_mysql.workers import prune_workers, put_worker, remove_worker, workers

__all__ = [
    "append_events",
    "attempts",
    "cancel",
    "claim",
    "cleanup",
    "delete_registration",
    "deleted_task",
    "enqueue",
    "finish",
    "finish_applied",
    "get",
    "next_run_at",
    "prune_events",
    "prune_workers",
    "put_registration",
    "put_worker",
    "query",
    "read_events",
    "redrive",
    "registrations",
    "remove_worker",
    "renew",
    "rescue",
    "resume",
    "save_progress",
    "summary",
    "suspend",
    "suspensions",
    "watch",
    "workers",
]

_snapshots = snapshot_rows
"""The old name of :func:`~taskmill_mysql.readback.snapshot_rows`, which
tests/test_contract_mysql.py imports from here (with :func:`append_events`)."""


# -- redriving ----------------------------------------------------------------------------


async def redrive(s: Session, task_id: str) -> Task:
    found = await s.fetchone(sql.REDRIVE_SELECT, (task_id,))
    if found is None:
        raise TaskNotFound(f"no task {task_id}")
    seq, status, alias_of, app_id, task_type, dedupe_key = found
    check_redrive(task_id, STATUS[status], alias_of)
    if dedupe_key is not None:
        leader = await s.fetchone(sql.FIND_LEADER, (app_id, task_type, dedupe_key))
        if leader is not None:
            raise key_taken(task_id, leader[0], dedupe_key)
    at = await now(s)
    s.defer(sql.REDRIVE, (at, at, seq))
    (row,) = await by_seq(s, [seq])
    await append_events(s, [(seq, task_id, REDRIVE_EVENT.value, "pending", at)])
    return task(row)


# -- reading -------------------------------------------------------------------------------


async def get(s: Session, task_id: str) -> Task | None:
    row = await s.fetchone(sql.SELECT_TASK, (task_id,))
    return None if row is None else task(row)


async def deleted_task(s: Session, task_id: str) -> Task | None:
    row = await s.fetchone(sql.SELECT_TOMBSTONE, (task_id,))
    return None if row is None else task(row)


async def query(s: Session, args: tuple[TaskFilter, int, int, bool, str | None]) -> list[Task]:
    filter, limit, offset, newest_first, after = args
    text, values = page_sql(
        sql.filter_sql(filter), table="tasks", columns=TASK_COLUMNS, limit=limit,
        offset=offset, newest_first=newest_first, after=after,
    )  # fmt: skip
    return [task(r) for r in await s.fetchall(text, values)]


async def summary(s: Session, filter: TaskFilter) -> ProgressSummary:
    selected = sql.filter_sql(filter)
    rows = await s.fetchall(
        f"SELECT status, COUNT(*), SUM(waiting_on > 0) FROM tasks{selected.where} GROUP BY status",
        selected.args,
    )
    waiting = sum(int(w or 0) for status, _, w in rows if status == "pending")
    return ProgressSummary.from_counts({status: int(n) for status, n, _ in rows}, waiting=waiting)


async def attempts(s: Session, task_id: str) -> list[Attempt]:
    return [attempt(task_id, r) for r in await s.fetchall(sql.ATTEMPTS, (task_id, task_id))]


async def next_run_at(s: Session, handlers: Sequence[HandlerKey]) -> datetime | None:
    best: datetime | None = None
    host_types = {t for a, t in handlers if a is None}
    for app_id, task_type in set(handlers):
        if app_id is None:
            row = await s.fetchone(sql.NEXT_RUN.format(app=""), (task_type,))
        elif task_type in host_types:
            continue  # the host key already covers every app's tasks of this type
        else:
            row = await s.fetchone(sql.NEXT_RUN.format(app=" AND app_id = %s"), (task_type, app_id))
        value = None if row is None else row[0]
        if value is not None and (best is None or value < best):
            best = value
    return None if best is None else as_datetime(best)


# -- retention -----------------------------------------------------------------------------


async def cleanup(s: Session, args: tuple[timedelta, frozenset[TaskStatus]]) -> int:
    older_than, statuses = args
    cutoff = await now(s) - older_than
    where = f"finished_at < %s AND status IN ({sql.marks(len(statuses))})"
    params = [cutoff, *(x.value for x in statuses)]
    await s.execute(
        "DELETE a FROM attempts AS a JOIN tasks AS t ON t.seq = a.task_seq "
        f"WHERE t.{where.replace(' AND status', ' AND t.status')}",
        params,
    )
    await s.execute(
        "DELETE d FROM task_dependencies AS d JOIN tasks AS t ON t.id = d.task_id "
        f"WHERE t.{where.replace(' AND status', ' AND t.status')}",
        params,
    )
    return await s.execute(f"DELETE FROM tasks WHERE {where}", params)
