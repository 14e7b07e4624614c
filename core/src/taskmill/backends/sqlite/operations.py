"""The domain operations of the SQLite backend, as functions of a connection.

Each runs on the storage's database thread inside one ``BEGIN IMMEDIATE`` transaction
(writes) or on its own (reads) (see :class:`~taskmill.backends.sqlite.connection.
SQLiteDatabase`). The transitions they make are the lifecycle kernel's
(:mod:`taskmill.lifecycle`): the statements come from
:mod:`taskmill.backends.sqlite.statements`, and every event kind, attempt outcome and
rescue or redrive decision is read from the kernel, not written here. What a task's end
settles (aliases, dependents) and what a cancel changes are sequenced by the settlement
engine (:mod:`taskmill.settlement`) over :class:`~taskmill.backends.sqlite.ledger.
SQLiteLedger`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from taskmill.backends.sqlite import statements as sql
from taskmill.backends.sqlite.ledger import SQLiteLedger, chunks, insert_events
from taskmill.backends.sqlite.rows import (
    ID,
    ONE_US,
    SEQ,
    TASK_COLUMNS,
    Row,
    as_datetime,
    as_micros,
    attempt,
    claimed,
    now_us,
    task,
)
from taskmill.cursors import position_token, token_position
from taskmill.errors import TaskNotFound
from taskmill.lifecycle import (
    DEFAULT_CANCEL_REASON,
    DEPENDENCY_CANCELLATION,
    FINISHES,
    REDRIVE_EVENT,
    RELEASED_ON_STOP,
    RESCUE_ERROR,
    RESCUES,
    Transition,
    cancel_targets,
    check_dependencies,
    check_redrive,
    dependency_blocks,
    dependency_error,
    enqueued,
    finish_kind,
    finish_rounds,
    key_taken,
    rescue_case,
    split_taken,
)
from taskmill.limiting import limit_claim, spend_claimed
from taskmill.limits import Bucket, scope_of
from taskmill.migrations import run_sync
from taskmill.model import (
    Attempt,
    AttemptOutcome,
    CancelReason,
    EventKind,
    ProgressSummary,
    SuspensionScope,
    Task,
    TaskEvent,
    TaskFilter,
    TaskStatus,
)
from taskmill.serialization import dumps
from taskmill.settlement import Settlement
from taskmill.settlement import cancel as settlement_cancel
from taskmill.sql.filters import page_sql
from taskmill.sql.rows import (
    EVENT_COLUMN_NAMES,
    REASON,
    STATUS,
    TASK_COLUMN_NAMES,
    events_of_rows,
)
from taskmill.storage import (
    LEASED_STATUS,
    ClaimRequest,
    Finish,
    FinishKind,
    HandlerKey,
    Lease,
    NewTask,
    ProgressUpdate,
    StoredWorker,
)

_STARTED: Final = EventKind.STARTED.value
_CANCEL_REQUESTED: Final = EventKind.CANCEL_REQUESTED.value
_PROGRESS: Final = EventKind.PROGRESS.value
_COMPLETED: Final = AttemptOutcome.COMPLETED.value
_APPLIED: Final = {
    kind: (t.event, None if t.outcome is None else t.outcome.value) for kind, t in FINISHES.items()
}
"""Per finish kind: its event, and the outcome it logs (None: the worker's)."""


def _applied(row: Row, kind: FinishKind, finish: Finish) -> tuple[Row, str, EventKind]:
    """(row, attempt outcome, event kind) of ``finish`` applied as ``kind``."""
    event_kind, outcome = _APPLIED[kind]
    return row, outcome or finish.outcome.value, event_kind


def _outcome(transition: Transition) -> str:
    assert transition.outcome is not None  # every rescue logs its own outcome
    return transition.outcome.value


# The tasks one enqueue inserted are exactly those above the largest seq read before


def _taken_ids(conn: sqlite3.Connection, tasks: Sequence[NewTask]) -> dict[str, Task]:
    """The stored tasks among ``tasks``' ids (read under the writer lock, so no other
    enqueue can insert one of them before this one commits)."""
    ids = list(dict.fromkeys(new.id for new in tasks))
    found: dict[str, Task] = {}
    for chunk in chunks(ids):
        marks = ", ".join("?" * len(chunk))
        for row in conn.execute(f"{sql.SELECT_TASKS} WHERE id IN ({marks})", list(chunk)):
            snapshot = task(row)
            found[snapshot.id] = snapshot
    return found


def _dependencies(
    conn: sqlite3.Connection, tasks: Sequence[NewTask]
) -> dict[str, tuple[str, str | None]]:
    """The (status, app id) of every task ``tasks`` depend on; refuses a dependency
    that does not exist or is another app's (before anything is written)."""
    wanted = list(dict.fromkeys(d for new in tasks for d in new.after))
    found: dict[str, tuple[str, str | None]] = {}
    for chunk in chunks(wanted):
        for task_id, status, app_id in conn.execute(sql.dependencies_sql(len(chunk)), chunk):
            found[task_id] = (status, app_id)
    check_dependencies(tasks, {task_id: app_id for task_id, (_, app_id) in found.items()})
    return found


def enqueue(conn: sqlite3.Connection, tasks: Sequence[NewTask]) -> list[Task]:
    now = now_us()
    now_dt = as_datetime(now)
    leaders: dict[tuple[str | None, str, str], str] = {}
    rows: list[Row] = []
    fresh, known = split_taken(tasks, _taken_ids(conn, tasks))
    depends = any(new.after for new in fresh)
    statuses = _dependencies(conn, fresh) if depends else {}
    edges: list[Row] = []
    blocked: dict[str, tuple[str, str]] = {}  # task id -> the dependency that cancels it
    for new in fresh:
        waiting = 0
        for dependency in new.after:
            status = statuses[dependency][0]
            blocks = dependency_blocks(STATUS[status], new.after_always)
            if blocks is None:
                waiting += 1
                edges.append((dependency, new.id, int(new.after_always)))
            elif blocks and new.id not in blocked:
                blocked[new.id] = (dependency, status)
        alias_of: str | None = None
        key = new.dedupe_key
        if key is not None:
            scope = (new.app_id, new.task_type, key)
            alias_of = leaders.get(scope)
            if alias_of is None:
                app_key: str | bytes = b"" if new.app_id is None else new.app_id
                found = conn.execute(sql.FIND_LEADER, (app_key, new.task_type, key)).fetchone()
                if found is None:
                    leaders[scope] = new.id
                else:
                    alias_of = leaders[scope] = found[0]
        if new.run_at is None:
            run_at, run_at_dt = now, now_dt
        else:
            run_at = as_micros(new.run_at)
            run_at_dt = as_datetime(run_at)
        priority = int(new.priority)
        rows.append(
            (
                new.id, new.task_type, now, run_at, now, new.app_id, new.params_json,
                priority, new.max_retries, key, alias_of, new.parent_id, new.user_id,
                waiting,
            )
        )  # fmt: skip
        known[new.id] = enqueued(new, now=now_dt, run_at=run_at_dt, alias_of=alias_of)
    if rows:
        last = conn.execute(sql.LAST_TASK_SEQ).fetchone()[0]
        conn.executemany(sql.INSERT, rows)
        conn.execute(sql.ENQUEUE_EVENTS, (now, last))
    if edges:
        conn.executemany(sql.INSERT_DEPENDENCY, edges)
    if blocked:
        ledger = SQLiteLedger(conn, now)
        for row in run_sync(_cancel_blocked(ledger, blocked)):
            known[row[ID]] = task(row)
        insert_events(conn, ledger.events)
    return [known[new.id] for new in tasks]


async def _cancel_blocked(ledger: SQLiteLedger, blocked: dict[str, tuple[str, str]]) -> list[Row]:
    """Cancel the tasks just enqueued that a dependency blocks (task id -> (dependency,
    its status)), with what that settles; every row changed."""
    settlement = Settlement(ledger)
    changed: list[Row] = []
    for task_id, (dependency, status) in blocked.items():
        error = dependency_error(dependency, STATUS[status])
        row = ledger.cancel_waiting(task_id, error)
        if row is None:
            continue  # an alias its blocked leader settled just before
        changed.append(row)
        changed += await settlement.transitioned(row, DEPENDENCY_CANCELLATION.event)
    return changed + await settlement.dependents()


_BUCKETS: Final = "SELECT tokens, updated_at FROM rate_buckets WHERE scope = ? AND task_type = ?"
_SAVE_BUCKET: Final = (
    "INSERT INTO rate_buckets (scope, task_type, tokens, updated_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (scope, task_type) DO UPDATE SET tokens = excluded.tokens, "
    "updated_at = excluded.updated_at"
)
_RUNNING_OF_TYPE: Final = (
    "SELECT count(*) FROM tasks WHERE status = 'running' AND task_type = ? AND lease_expires_at > ?"
)
_RUNNING_OF_APP: Final = _RUNNING_OF_TYPE + " AND app_id = ?"


class _SQLiteBuckets:
    """:class:`taskmill.limiting.BucketLedger` inside a claim's ``BEGIN IMMEDIATE``
    transaction at ``now`` (integer microseconds): that transaction holds the database's
    one writer lock, so reading a bucket is locking it."""

    __slots__ = ("_conn", "_now")

    def __init__(self, conn: sqlite3.Connection, now: int) -> None:
        self._conn = conn
        self._now = now

    async def lock_buckets(
        self, keys: Sequence[HandlerKey]
    ) -> tuple[dict[HandlerKey, Bucket], float]:
        buckets: dict[HandlerKey, Bucket] = {}
        for key in keys:
            row = self._conn.execute(_BUCKETS, (scope_of(key), key[1])).fetchone()
            if row is not None:
                buckets[key] = Bucket(row[0], row[1])
        return buckets, self._now / 1e6

    async def count_running(self, keys: Sequence[HandlerKey]) -> dict[HandlerKey, int]:
        running: dict[HandlerKey, int] = {}
        for app_id, task_type in keys:
            if app_id is None:
                row = self._conn.execute(_RUNNING_OF_TYPE, (task_type, self._now)).fetchone()
            else:
                row = self._conn.execute(_RUNNING_OF_APP, (task_type, self._now, app_id)).fetchone()
            running[app_id, task_type] = row[0]
        return running

    async def save_buckets(self, tokens: Mapping[HandlerKey, float], now: float) -> None:
        self._conn.executemany(
            _SAVE_BUCKET, [(scope_of(key), key[1], left, now) for key, left in tokens.items()]
        )


def claim(conn: sqlite3.Connection, request: ClaimRequest) -> list[Task]:
    now = now_us()
    limited = None
    if request.limits:
        ledger = _SQLiteBuckets(conn, now)
        limited = run_sync(limit_claim(ledger, request))
        request = limited.request
    scopes = conn.execute(sql.SUSPENSIONS).fetchall()
    suspended = [SuspensionScope(task_type=t, app_id=a) for t, a in scopes]
    statement = sql.claim_statement(request, now, suspended)
    if statement is None:
        return []
    text, params = statement
    rows = conn.execute(text, params).fetchall()
    if not rows:
        return []
    snapshots = claimed(rows)  # also puts rows in claim order
    insert_events(conn, [(r[SEQ], r[ID], _STARTED, "running", now) for r in rows])
    if limited is not None:
        run_sync(spend_claimed(ledger, limited, ((t.app_id, t.task_type) for t in snapshots)))
    return snapshots


def _finish_values(finish: Finish, now: int) -> Row:
    """The VALUES row of one finish (see statements.FINISH_SETS)."""
    lease = finish.lease
    kind = finish.kind
    progress = finish.progress
    data = None if finish.data is None else dumps(finish.data)
    if progress is None:
        has_progress, done, total, message = 0, None, None, None
    else:
        has_progress, done, total, message = 1, progress.done, progress.total, progress.message
    run_at = None
    if kind is FinishKind.RETRY:
        run_at = now + round(finish.retry_in * 1e6)
    reason = None
    if kind is FinishKind.CANCEL:
        reason = (finish.cancel_reason or DEFAULT_CANCEL_REASON).value
    return (
        lease.task_id, lease.worker_id, lease.attempt, finish.result_json, run_at,
        finish.error, reason, data, has_progress, done, total, message,
    )  # fmt: skip


def _apply_finishes(
    conn: sqlite3.Connection, now: int, kind: FinishKind, values: list[Row], *, bury: bool = False
) -> dict[str, Row]:
    """Run the batched statement of ``kind`` (with ``bury``: the tombstones'
    :func:`~taskmill.backends.sqlite.statements.bury_sql`); the rows as the finish
    leaves them, by task id."""
    statement = sql.bury_sql if bury else sql.finish_sql
    out: dict[str, Row] = {}
    for start in range(0, len(values), sql.FINISH_CHUNK):
        chunk = values[start : start + sql.FINISH_CHUNK]
        size = sql.bucket(len(chunk))
        params: list[Any] = [now]
        for row in chunk:
            params += row
        for _ in range(size - len(chunk)):
            params += sql.FINISH_PAD
        for row in conn.execute(statement(kind, size), params):
            out[row[ID]] = row
    return out


def finish(conn: sqlite3.Connection, finishes: Sequence[Finish]) -> list[Task | None]:
    """Apply ``finishes``; per finish, the new snapshot, or None (lease lost)."""
    results: list[Task | None] = [None] * len(finishes)
    run_sync(_finish(conn, finishes, results, task))
    return results


def finish_applied(conn: sqlite3.Connection, finishes: Sequence[Finish]) -> list[bool]:
    """:func:`finish` without building snapshots: per finish, whether it was applied."""
    applied = [False] * len(finishes)
    run_sync(_finish(conn, finishes, applied, _applied_flag))
    return applied


def _applied_flag(row: Row) -> bool:
    return True


async def _finish(
    conn: sqlite3.Connection,
    finishes: Sequence[Finish],
    results: list[Any],
    result_of: Callable[[Row], Any],
) -> None:
    """The changes of :func:`finish`; ``results[i] = result_of(new row)`` per applied
    finish ``i``."""
    now = now_us()
    log: list[Row] = []
    ledger = SQLiteLedger(conn, now)
    settlement = Settlement(ledger)
    buried = ledger.buried
    gone: set[str] = set()
    """The tasks whose tombstones this call wrote: their rows stay RUNNING until the
    settlement deletes them, so a later round's finish must not match them."""
    for indexes in finish_rounds(finishes):
        by_kind: dict[tuple[FinishKind, bool], list[int]] = {}
        for index in indexes:
            one = finishes[index]
            if gone and one.lease.task_id in gone:
                continue
            doomed = one.delete and one.kind in sql.BURIED
            by_kind.setdefault((one.kind, doomed), []).append(index)
        values = {index: _finish_values(finishes[index], now) for index in indexes}
        # index -> (new row, attempt outcome, event kind)
        applied: dict[int, tuple[Row, str, EventKind]] = {}
        released: list[int] = []
        for (kind, doomed), members in by_kind.items():
            rows = _apply_finishes(conn, now, kind, [values[i] for i in members], bury=doomed)
            if doomed:
                for entombed in rows.values():
                    buried.add(entombed[SEQ])
                    gone.add(entombed[ID])
            for index in members:
                row = rows.get(finishes[index].lease.task_id)
                if row is not None:
                    applied[index] = _applied(row, kind, finishes[index])
                elif kind in RELEASED_ON_STOP:
                    released.append(index)
        if released:
            # Still held, but a stop (suspension, shutdown) was requested: the
            # statement of the kind finish_kind() gives such a task.
            stopped = finish_kind(FinishKind.RETRY, stop_requested=True)
            rows = _apply_finishes(conn, now, stopped, [values[i] for i in released])
            for index in released:
                row = rows.get(finishes[index].lease.task_id)
                if row is not None:
                    applied[index] = _applied(row, stopped, finishes[index])
        for index in indexes:
            if index not in applied:
                continue
            row, outcome, kind_event = applied[index]
            finish = finishes[index]
            await settlement.transitioned(row, kind_event, delete=finish.delete)
            lease = finish.lease
            log.append(
                (
                    row[SEQ], lease.task_id, lease.attempt, lease.worker_id,
                    as_micros(finish.started_at), as_micros(finish.finished_at), outcome,
                    None if outcome == _COMPLETED else finish.error,
                )
            )  # fmt: skip
            results[index] = result_of(row)
    if settlement.pending:
        await settlement.dependents()
    if ledger.forgotten:  # deleted with their logs: their last attempts are not written
        forgotten = ledger.forgotten
        log = [entry for entry in log if entry[0] not in forgotten]
    if log:
        conn.executemany(sql.INSERT_ATTEMPT, log)
    if ledger.events:
        insert_events(conn, ledger.events)


def renew(
    conn: sqlite3.Connection, args: tuple[Sequence[Lease], float]
) -> dict[str, CancelReason | None]:
    leases, lease_seconds = args
    until = now_us() + round(lease_seconds * 1e6)
    held: dict[str, CancelReason | None] = {}
    for lease in leases:
        row = conn.execute(sql.RENEW, (until, lease.task_id, lease.worker_id, lease.attempt))
        found = row.fetchone()
        if found is not None:
            held[found[0]] = None if found[1] is None else REASON[found[1]]
    return held


def save_progress(conn: sqlite3.Connection, updates: Sequence[ProgressUpdate]) -> set[str]:
    now = now_us()
    written: set[str] = set()
    events: list[Row] = []
    for update in updates:
        params: list[Any] = [now]
        progress = update.progress
        if progress is not None:
            params += (progress.done, progress.total, progress.message)
        if update.data is not None:
            params.append(dumps(update.data))
        lease = update.lease
        params += (lease.task_id, lease.worker_id, lease.attempt)
        text = sql.PROGRESS_SQL[progress is not None, update.data is not None]
        found = conn.execute(text, params).fetchone()
        if found is not None:
            written.add(lease.task_id)
            events.append((found[0], lease.task_id, _PROGRESS, "running", now))
    if events:
        insert_events(conn, events)
    return written


def rescue(conn: sqlite3.Connection, limit: int) -> list[Task]:
    return run_sync(_rescue(conn, limit))


async def _rescue(conn: sqlite3.Connection, limit: int) -> list[Task]:
    now = now_us()
    expired = conn.execute(sql.RESCUE_SELECT, (now, limit)).fetchall()
    rescued: list[Task] = []
    log: list[Row] = []
    ledger = SQLiteLedger(conn, now)
    settlement = Settlement(ledger)
    for seq, task_id, worker_id, attempts, max_retries, started_at, reason in expired:
        case = rescue_case(None if reason is None else REASON[reason], attempts, max_retries)
        transition = RESCUES[case]
        row = conn.execute(sql.RESCUE[case], (now, task_id)).fetchone()
        await settlement.transitioned(row, transition.event)
        log.append(
            (
                seq, task_id, attempts, worker_id or "",
                now if started_at is None else started_at, now, _outcome(transition),
                RESCUE_ERROR,
            )
        )  # fmt: skip
        rescued.append(task(row))
    if settlement.pending:
        await settlement.dependents()
    if log:
        conn.executemany(sql.INSERT_ATTEMPT, log)
        insert_events(conn, ledger.events)
    return rescued


def redrive(conn: sqlite3.Connection, task_id: str) -> Task:
    found = conn.execute(sql.REDRIVE_SELECT, (task_id,)).fetchone()
    if found is None:
        raise TaskNotFound(f"no task {task_id}")
    status, alias_of, app_id, task_type, dedupe_key = found
    check_redrive(task_id, STATUS[status], alias_of)
    if dedupe_key is not None:
        app_key: str | bytes = b"" if app_id is None else app_id
        leader = conn.execute(sql.FIND_LEADER, (app_key, task_type, dedupe_key)).fetchone()
        if leader is not None:
            raise key_taken(task_id, leader[0], dedupe_key)
    now = now_us()
    row = conn.execute(sql.REDRIVE, (now, now, task_id)).fetchone()
    conn.execute(sql.INSERT_EVENT, (row[SEQ], task_id, REDRIVE_EVENT.value, "pending", now))
    return task(row)


def get(conn: sqlite3.Connection, task_id: str) -> Task | None:
    row = conn.execute(sql.SELECT_TASK, (task_id,)).fetchone()
    return None if row is None else task(row)


def query(
    conn: sqlite3.Connection, args: tuple[TaskFilter, int, int, bool, str | None]
) -> list[Task]:
    filter, limit, offset, newest_first, after = args
    text, values = page_sql(
        sql.filter_sql(filter), table="tasks", columns=TASK_COLUMNS, limit=limit,
        offset=offset, newest_first=newest_first, after=after,
    )  # fmt: skip
    return [task(r) for r in conn.execute(text, values)]


def summary(conn: sqlite3.Connection, filter: TaskFilter) -> ProgressSummary:
    selected = sql.filter_sql(filter)
    counts: dict[str, int] = {}
    waiting = 0
    for status, count, blocked in conn.execute(
        f"SELECT status, count(*), sum(waiting_on > 0) FROM tasks{selected.where} GROUP BY status",
        selected.args,
    ):
        counts[status] = count
        if status == "pending":
            waiting = blocked or 0
    return ProgressSummary.from_counts(counts, waiting=waiting)


def attempts(conn: sqlite3.Connection, task_id: str) -> list[Attempt]:
    return [attempt(task_id, r) for r in conn.execute(sql.ATTEMPTS, (task_id,))]


def next_run_at(conn: sqlite3.Connection, handlers: Sequence[HandlerKey]) -> datetime | None:
    best: int | None = None
    host_types = {t for a, t in handlers if a is None}
    for app_id, task_type in set(handlers):
        if app_id is None:
            row = conn.execute(sql.NEXT_HOST, (task_type,)).fetchone()
        elif task_type in host_types:
            continue  # the host key already covers every app's tasks of this type
        else:
            row = conn.execute(sql.NEXT_APP, (task_type, app_id)).fetchone()
        value = row[0]
        if value is not None and (best is None or value < best):
            best = value
    return None if best is None else as_datetime(best)


def cleanup(conn: sqlite3.Connection, args: tuple[timedelta, frozenset[TaskStatus]]) -> int:
    older_than, statuses = args
    cutoff = now_us() - older_than // ONE_US
    marks = ", ".join("?" * len(statuses))
    where = f"finished_at < ? AND status IN ({marks})"
    params = [cutoff, *(s.value for s in statuses)]
    conn.execute(
        f"DELETE FROM attempts WHERE task_seq IN (SELECT seq FROM tasks WHERE {where})", params
    )
    conn.execute(
        f"DELETE FROM task_dependencies WHERE task_id IN (SELECT id FROM tasks WHERE {where})",
        params,
    )
    return conn.execute(f"DELETE FROM tasks WHERE {where}", params).rowcount


def _cancel_targets(
    conn: sqlite3.Connection,
    task_ids: Sequence[str] | None,
    filter: TaskFilter | None,
    cascade: bool,
) -> list[str]:
    """The ids a cancel applies to, in the reference store's order: those named, the
    active tasks ``filter`` selects (in creation order), then breadth first their
    descendants (each task's children in creation order)."""
    selected: dict[str, None] = dict.fromkeys(task_ids or ())
    if filter is not None:
        chosen = sql.filter_sql(filter)
        active = "status IN ('pending', 'running')"
        where = f"{chosen.where} AND {active}" if chosen.clauses else f" WHERE {active}"
        found = conn.execute(f"SELECT id FROM tasks{where} ORDER BY seq", chosen.args)
        selected.update((row[0], None) for row in found)

    async def children_of(level: list[str]) -> list[tuple[str, str]]:
        pairs: list[tuple[str, str]] = []
        for chunk in chunks(level):
            text = (
                "SELECT id, parent_id FROM tasks "
                f"WHERE parent_id IN ({sql.marks(len(chunk))}) ORDER BY seq"
            )
            pairs += conn.execute(text, chunk).fetchall()
        return pairs

    return run_sync(cancel_targets(selected, children_of if cascade else None))


def cancel(
    conn: sqlite3.Connection,
    args: tuple[Sequence[str] | None, TaskFilter | None, CancelReason, bool],
) -> list[Task]:
    task_ids, filter, reason, cascade = args
    now = now_us()
    targets = _cancel_targets(conn, task_ids, filter, cascade)
    ledger = SQLiteLedger(conn, now)
    changed = run_sync(settlement_cancel(ledger, targets, reason, as_datetime(now)))
    insert_events(conn, ledger.events)
    return [task(r) for r in changed]


def watch(conn: sqlite3.Connection, leases: Sequence[Lease]) -> dict[str, CancelReason | None]:
    found: dict[str, tuple[str, int, str | None]] = {}
    for chunk in chunks(leases):
        text = (
            "SELECT id, worker_id, attempts, cancel_reason FROM tasks "
            f"WHERE id IN ({sql.marks(len(chunk))}) AND status = 'running'"
        )
        for task_id, worker_id, attempts, reason in conn.execute(text, [x.task_id for x in chunk]):
            found[task_id] = (worker_id, attempts, reason)
    held: dict[str, CancelReason | None] = {}
    for lease in leases:
        row = found.get(lease.task_id)
        # (the rows selected are RUNNING ones)
        if row is not None and lease.holds(lease.task_id, LEASED_STATUS, row[0], row[1]):
            held[lease.task_id] = None if row[2] is None else REASON[row[2]]
    return held


def suspend(conn: sqlite3.Connection, scope: SuspensionScope) -> int:
    now = now_us()
    conn.execute(sql.SUSPEND, (scope.task_type, scope.app_id, now))
    where = "status = 'running' AND cancel_reason IS NULL"
    params: list[Any] = [now]
    if scope.task_type is not None:
        where += " AND task_type = ?"
        params.append(scope.task_type)
    if scope.app_id is not None:
        where += " AND app_id = ?"
        params.append(scope.app_id)
    asked = conn.execute(
        f"UPDATE tasks SET cancel_reason = 'suspended', updated_at = ? WHERE {where} "
        "RETURNING seq, id",
        params,
    ).fetchall()
    if asked:
        asked.sort()
        insert_events(conn, [(seq, i, _CANCEL_REQUESTED, "running", now) for seq, i in asked])
    return len(asked)


def resume(conn: sqlite3.Connection, scope: SuspensionScope) -> bool:
    return conn.execute(sql.RESUME, (scope.task_type, scope.app_id)).rowcount > 0


def suspensions(conn: sqlite3.Connection, _: None) -> list[SuspensionScope]:
    scopes = [SuspensionScope(task_type=t, app_id=a) for t, a in conn.execute(sql.SUSPENSIONS)]
    scopes.sort(key=lambda s: (s.task_type or "", s.app_id or ""))
    return scopes


def read_events(
    conn: sqlite3.Connection, args: tuple[str | None, int]
) -> tuple[list[TaskEvent], str]:
    after, limit = args
    if after is None:
        # The last seq ever assigned (AUTOINCREMENT keeps it even when pruned away).
        last = conn.execute(sql.EVENTS_CURSOR).fetchone()
        return [], position_token(0 if last is None else int(last[0]))
    position = token_position(after)
    if limit <= 0:
        return [], after
    rows = conn.execute(sql.READ_EVENTS, (position, limit)).fetchall()
    if not rows:
        return [], after
    events = events_of_rows([_live_or_tombstone(r) for r in rows], task=task, timestamp=as_datetime)
    return events, position_token(int(rows[-1][0]))


_EVENT_WIDTH: Final = len(EVENT_COLUMN_NAMES)
_TOMBSTONE_AT: Final = _EVENT_WIDTH + len(TASK_COLUMN_NAMES)


def _live_or_tombstone(row: Row) -> Row:
    """A :data:`statements.READ_EVENTS` row as :func:`events_of_rows` reads it: the event
    columns, then the task's, or its tombstone's when the task is gone."""
    if row[_EVENT_WIDTH + ID] is not None or row[_TOMBSTONE_AT + ID] is None:
        return row[:_TOMBSTONE_AT]
    return row[:_EVENT_WIDTH] + row[_TOMBSTONE_AT:]


def deleted_task(conn: sqlite3.Connection, task_id: str) -> Task | None:
    found = conn.execute(sql.TOMBSTONE, (task_id,)).fetchone()
    return None if found is None else task(found)


def prune_events(conn: sqlite3.Connection, older_than: timedelta) -> int:
    cutoff = now_us() - older_than // ONE_US
    # `at` is read under the writer lock, so it only grows with seq (unless the wall
    # clock steps back): the events to delete are the prefix of the log before the first
    # young one, found by walking exactly that prefix. After a clock step back this
    # keeps some old events until a later prune; it never deletes a young one.
    # The tombstones as old, a prefix by n in the same way.
    young = conn.execute(sql.FIRST_YOUNG_TOMBSTONE, (cutoff,)).fetchone()
    if young is None:
        conn.execute("DELETE FROM tombstones WHERE deleted_at < ?", (cutoff,))
    else:
        conn.execute("DELETE FROM tombstones WHERE n < ?", (young[0],))
    first_young = conn.execute(sql.FIRST_YOUNG_EVENT, (cutoff,)).fetchone()
    if first_young is None:
        return conn.execute("DELETE FROM events WHERE at < ?", (cutoff,)).rowcount
    return conn.execute("DELETE FROM events WHERE seq < ?", (first_young[0],)).rowcount


# -- the worker registry -----------------------------------------------------------------


def put_worker(conn: sqlite3.Connection, args: tuple[str, str]) -> None:
    worker_id, record = args
    conn.execute(
        "INSERT OR REPLACE INTO workers (id, heartbeat_at, record) VALUES (?, ?, ?)",
        (worker_id, now_us(), record),
    )


def workers(conn: sqlite3.Connection, _: None) -> list[StoredWorker]:
    return [
        StoredWorker(id=i, heartbeat_at=as_datetime(at), record=record)
        for i, at, record in conn.execute(
            "SELECT id, heartbeat_at, record FROM workers ORDER BY id"
        )
    ]


def remove_worker(conn: sqlite3.Connection, worker_id: str) -> bool:
    return conn.execute("DELETE FROM workers WHERE id = ?", (worker_id,)).rowcount > 0


def prune_workers(conn: sqlite3.Connection, older_than: timedelta) -> int:
    cutoff = now_us() - older_than // ONE_US
    return conn.execute("DELETE FROM workers WHERE heartbeat_at < ?", (cutoff,)).rowcount
