"""The domain operations of the SQLite backend, as functions of a connection.

Each runs on the storage's database thread inside one ``BEGIN IMMEDIATE`` transaction
(writes) or on its own (reads) (see :class:`~taskmill.backends.sqlite.connection.
SQLiteDatabase`). The transitions they make are the lifecycle kernel's
(:mod:`taskmill.lifecycle`): the statements come from
:mod:`taskmill.backends.sqlite.statements`, and every event kind, attempt outcome and
rescue or redrive decision is read from the kernel, not written here.

Longer than 600 lines: these are the 24 operations of one transaction boundary, each a
short function; splitting them by topic would scatter the helpers they share
(chunking, alias settlement, the event writer).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

import attrs

from taskmill.backends.sqlite import statements as sql
from taskmill.backends.sqlite.rows import (
    CANCEL_REASON,
    ERROR,
    EVENT_COLUMNS,
    ID,
    ONE_US,
    RESULT,
    SEQ,
    STATUS_COL,
    TASK_COLUMNS,
    Row,
    as_datetime,
    as_micros,
    attempt,
    claimed,
    event,
    now_us,
    task,
)
from taskmill.cursors import position_token, token_position
from taskmill.errors import TaskNotFound
from taskmill.lifecycle import (
    CANCELLATION,
    DEFAULT_CANCEL_REASON,
    DEPENDENCY_CANCELLATION,
    FINISHES,
    REDRIVE_EVENT,
    RELEASED_ON_STOP,
    RESCUE_ERROR,
    RESCUES,
    TERMINAL_EVENTS,
    DependentOutcome,
    Transition,
    cancel_error,
    cancel_targets,
    check_redrive,
    dependency_blocks,
    dependency_error,
    dependency_settles,
    enqueued,
    finish_kind,
    finish_rounds,
    key_taken,
    rescue_case,
    split_taken,
    unknown_dependency,
)
from taskmill.limits import (
    Bucket,
    limited_caps,
    locked_keys,
    refill,
    scope_of,
    spend,
    taken_by_key,
)
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
from taskmill.sql.rows import REASON, STATUS, leads_aliases
from taskmill.storage import (
    ClaimRequest,
    Finish,
    FinishKind,
    HandlerKey,
    Lease,
    NewTask,
    ProgressUpdate,
)

T = TypeVar("T")

_TERMINAL_EVENT: Final = {s.value: e.value for s, e in TERMINAL_EVENTS.items()}
"""The event of a leader or alias reaching each terminal status (by stored value)."""
_REQUEUED: Final = EventKind.REQUEUED.value
_RELEASED: Final = EventKind.RELEASED.value
_TERMINAL: Final = frozenset(_TERMINAL_EVENT)
assert DEPENDENCY_CANCELLATION.event.value == CANCELLATION.event.value
_STARTED: Final = EventKind.STARTED.value
_CANCEL_REQUESTED: Final = EventKind.CANCEL_REQUESTED.value
_CANCELLED_EVENT: Final = CANCELLATION.event.value
assert CANCELLATION.outcome is not None
_CANCELLED_OUTCOME: Final = CANCELLATION.outcome.value
_PROGRESS: Final = EventKind.PROGRESS.value
_COMPLETED: Final = AttemptOutcome.COMPLETED.value
_APPLIED: Final = {
    kind: (t.event.value, None if t.outcome is None else t.outcome.value)
    for kind, t in FINISHES.items()
}
"""Per finish kind: its event, and the outcome it logs (None: the worker's)."""


def _applied(row: Row, kind: FinishKind, finish: Finish) -> tuple[Row, str, str]:
    """(row, attempt outcome, event kind) of ``finish`` applied as ``kind``."""
    event_kind, outcome = _APPLIED[kind]
    return row, outcome or finish.outcome.value, event_kind


def _outcome(transition: Transition) -> str:
    assert transition.outcome is not None  # every rescue logs its own outcome
    return transition.outcome.value


def insert_events(conn: sqlite3.Connection, events: list[Row]) -> None:
    """Append ``events`` (task_seq, task_id, kind, status, at), in order.

    A batch is one multi-row statement per 128 events rather than ``executemany``,
    which runs the statement (and the AUTOINCREMENT bookkeeping in sqlite_sequence)
    once per row: this is on the claim and finish paths, two events per task. Sizes
    are rounded up to a multiple of 8 (at most 23 distinct statements): padding to a
    power of two, as the finishes do, made a batch of 100 events cost 40% more.
    """
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


# The tasks one enqueue inserted are exactly those above the largest seq read before


def _taken_ids(conn: sqlite3.Connection, tasks: Sequence[NewTask]) -> dict[str, Task]:
    """The stored tasks among ``tasks``' ids (read under the writer lock, so no other
    enqueue can insert one of them before this one commits)."""
    ids = list(dict.fromkeys(new.id for new in tasks))
    found: dict[str, Task] = {}
    for chunk in _chunks(ids):
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
    for chunk in _chunks(wanted):
        for task_id, status, app_id in conn.execute(sql.dependencies_sql(len(chunk)), chunk):
            found[task_id] = (status, app_id)
    for new in tasks:
        for dependency in new.after:
            if dependency not in found:
                raise unknown_dependency(dependency, new.app_id, None)
            if found[dependency][1] != new.app_id:
                raise unknown_dependency(dependency, new.app_id, found[dependency][1])
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
        events: list[Row] = []
        for task_id, (dependency, status) in blocked.items():
            error = dependency_error(dependency, STATUS[status])
            row = conn.execute(sql.DEPENDENCY_CANCEL, (now, error, task_id)).fetchone()
            events.append((row[SEQ], row[ID], _CANCELLED_EVENT, "cancelled", now))
            known[task_id] = task(row)
        ended = [(task_id, "cancelled") for task_id in blocked]
        settle_dependents(conn, ended, now, events)
        insert_events(conn, events)
    return [known[new.id] for new in tasks]


def settle_dependents(
    conn: sqlite3.Connection, ended: list[tuple[str, str]], now: int, events: list[Row]
) -> list[Row]:
    """Settle the dependents of the tasks that just ended, given as (id, stored status),
    as :func:`taskmill.lifecycle.dependency_settles` says, and in turn those of the
    dependents that cancels; append the events to ``events``.

    :returns: the rows of the dependents cancelled.
    """
    cancelled: list[Row] = []
    level = ended
    while level:
        status_of = dict(level)
        edges: list[Row] = []
        for chunk in _chunks(list(status_of)):
            edges += conn.execute(sql.resolve_edges_sql(len(chunk)), chunk).fetchall()
        level = []
        for dependency, dependent_id, always in edges:
            found = conn.execute(sql.COUNT_DOWN, (dependent_id,)).fetchone()
            if found is None:
                continue  # deleted by cleanup
            seq, status, left = found
            ended_as = STATUS[status_of[dependency]]
            blocks = bool(dependency_blocks(ended_as, bool(always)))
            outcome = dependency_settles(STATUS[status], left, blocks=blocks)
            if outcome is DependentOutcome.RELEASED:
                events.append((seq, dependent_id, _RELEASED, "pending", now))
            elif outcome is DependentOutcome.CANCELLED:
                error = dependency_error(dependency, ended_as)
                row = conn.execute(sql.DEPENDENCY_CANCEL, (now, error, dependent_id)).fetchone()
                events.append((seq, dependent_id, _CANCELLED_EVENT, "cancelled", now))
                cancelled.append(row)
                level.append((dependent_id, "cancelled"))
    return cancelled


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


def _limited(
    conn: sqlite3.Connection, request: ClaimRequest, now: int
) -> tuple[dict[HandlerKey, int | None], dict[HandlerKey, float]]:
    """The request's caps cut by its global limits, read inside the claim's
    ``BEGIN IMMEDIATE`` transaction (see :mod:`taskmill.limits`), and the refilled
    tokens of its rate-limited keys."""
    now_s = now / 1e6
    tokens: dict[HandlerKey, float] = {}
    running: dict[HandlerKey, int] = {}
    for key in locked_keys(request.handlers, request.limits):
        limit = request.limits[key]
        app_id, task_type = key
        if limit.rate is not None:
            row = conn.execute(_BUCKETS, (scope_of(key), task_type)).fetchone()
            bucket = None if row is None else Bucket(row[0], row[1])
            tokens[key] = refill(bucket, limit.rate, now_s)
        if limit.max_running is not None:
            if app_id is None:
                row = conn.execute(_RUNNING_OF_TYPE, (task_type, now)).fetchone()
            else:
                row = conn.execute(_RUNNING_OF_APP, (task_type, now, app_id)).fetchone()
            running[key] = row[0]
    caps = limited_caps(request.handlers, request.limits, tokens=tokens, running=running)
    return caps, tokens


def claim(conn: sqlite3.Connection, request: ClaimRequest) -> list[Task]:
    now = now_us()
    tokens: dict[HandlerKey, float] = {}
    if request.limits:
        handlers, tokens = _limited(conn, request, now)
        request = attrs.evolve(request, handlers=handlers)
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
    if tokens:
        taken = taken_by_key(((t.app_id, t.task_type) for t in snapshots), request.handlers)
        conn.executemany(
            _SAVE_BUCKET,
            [
                (scope_of(key), key[1], spend(left, taken.get(key, 0)), now / 1e6)
                for key, left in tokens.items()
                if taken.get(key)
            ],
        )
    return snapshots


def _settle_aliases(
    conn: sqlite3.Connection, leader: Row, now: int, events: list[Row]
) -> list[Row]:
    """Give a terminal leader's aliases what :data:`~taskmill.lifecycle.ALIAS_FIELDS`
    names; append their events (the leader's terminal kind) to ``events``.

    :returns: the aliases' new rows, in creation order.
    """
    status = leader[STATUS_COL]
    rows = conn.execute(
        sql.SETTLE_ALIASES,
        (
            status, leader[RESULT], leader[ERROR], leader[CANCEL_REASON],
            now, now, leader[ID],
        ),
    ).fetchall()  # fmt: skip
    if rows:
        rows.sort(key=lambda r: r[SEQ])
        kind = _TERMINAL_EVENT[status]
        events += [(r[SEQ], r[ID], kind, status, now) for r in rows]
    return rows


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
    conn: sqlite3.Connection, now: int, kind: FinishKind, values: list[Row]
) -> dict[str, Row]:
    """Run the batched statement of ``kind``; the returned rows by task id."""
    out: dict[str, Row] = {}
    for start in range(0, len(values), sql.FINISH_CHUNK):
        chunk = values[start : start + sql.FINISH_CHUNK]
        size = sql.bucket(len(chunk))
        params: list[Any] = [now]
        for row in chunk:
            params += row
        for _ in range(size - len(chunk)):
            params += sql.FINISH_PAD
        for row in conn.execute(sql.finish_sql(kind, size), params):
            out[row[ID]] = row
    return out


def finish(conn: sqlite3.Connection, finishes: Sequence[Finish]) -> list[Task | None]:
    """Apply ``finishes``; per finish, the new snapshot, or None (lease lost)."""
    results: list[Task | None] = [None] * len(finishes)
    _finish(conn, finishes, results, task)
    return results


def finish_applied(conn: sqlite3.Connection, finishes: Sequence[Finish]) -> list[bool]:
    """:func:`finish` without building snapshots: per finish, whether it was applied."""
    applied = [False] * len(finishes)
    _finish(conn, finishes, applied, _applied_flag)
    return applied


def _applied_flag(row: Row) -> bool:
    return True


def _finish(
    conn: sqlite3.Connection,
    finishes: Sequence[Finish],
    results: list[Any],
    result_of: Callable[[Row], Any],
) -> None:
    """The changes of :func:`finish`; ``results[i] = result_of(new row)`` per applied
    finish ``i``."""
    now = now_us()
    log: list[Row] = []
    events: list[Row] = []
    ended: list[tuple[str, str]] = []
    for indexes in finish_rounds(finishes):
        by_kind: dict[FinishKind, list[int]] = {}
        for index in indexes:
            by_kind.setdefault(finishes[index].kind, []).append(index)
        values = {index: _finish_values(finishes[index], now) for index in indexes}
        # index -> (new row, attempt outcome, event kind)
        applied: dict[int, tuple[Row, str, str]] = {}
        released: list[int] = []
        for kind, members in by_kind.items():
            rows = _apply_finishes(conn, now, kind, [values[i] for i in members])
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
            events.append((row[SEQ], row[ID], kind_event, row[STATUS_COL], now))
            if row[STATUS_COL] in _TERMINAL:
                ended.append((row[ID], row[STATUS_COL]))
            if leads_aliases(row):
                for alias in _settle_aliases(conn, row, now, events):
                    ended.append((alias[ID], alias[STATUS_COL]))
            finish = finishes[index]
            lease = finish.lease
            log.append(
                (
                    row[SEQ], lease.task_id, lease.attempt, lease.worker_id,
                    as_micros(finish.started_at), as_micros(finish.finished_at), outcome,
                    None if outcome == _COMPLETED else finish.error,
                )
            )  # fmt: skip
            results[index] = result_of(row)
    if ended:
        settle_dependents(conn, ended, now, events)
    if log:
        conn.executemany(sql.INSERT_ATTEMPT, log)
        insert_events(conn, events)


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
    now = now_us()
    expired = conn.execute(sql.RESCUE_SELECT, (now, limit)).fetchall()
    rescued: list[Task] = []
    log: list[Row] = []
    events: list[Row] = []
    ended: list[tuple[str, str]] = []
    for seq, task_id, worker_id, attempts, max_retries, started_at, reason in expired:
        case = rescue_case(None if reason is None else REASON[reason], attempts, max_retries)
        transition = RESCUES[case]
        row = conn.execute(sql.RESCUE[case], (now, task_id)).fetchone()
        status = row[STATUS_COL]
        events.append((seq, task_id, transition.event.value, status, now))
        if status in _TERMINAL:
            ended.append((task_id, status))
        if leads_aliases(row):
            for alias in _settle_aliases(conn, row, now, events):
                ended.append((alias[ID], alias[STATUS_COL]))
        log.append(
            (
                seq, task_id, attempts, worker_id or "",
                now if started_at is None else started_at, now, _outcome(transition),
                RESCUE_ERROR,
            )
        )  # fmt: skip
        rescued.append(task(row))
    if ended:
        settle_dependents(conn, ended, now, events)
    if log:
        conn.executemany(sql.INSERT_ATTEMPT, log)
        insert_events(conn, events)
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
    selected = sql.filter_sql(filter)
    order = "DESC" if newest_first else "ASC"
    clauses = list(selected.clauses)
    values = list(selected.args)
    if after is not None:
        clauses.append(f"seq {'<' if newest_first else '>'} (SELECT seq FROM tasks WHERE id = ?)")
        values.append(after)
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    text = f"SELECT {TASK_COLUMNS} FROM tasks{where} ORDER BY seq {order} LIMIT ? OFFSET ?"
    return [task(r) for r in conn.execute(text, [*values, limit, offset])]


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


def _chunks(items: Sequence[T]) -> list[Sequence[T]]:
    return [items[i : i + sql.CHUNK] for i in range(0, len(items), sql.CHUNK)]


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
        for chunk in _chunks(level):
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
    rows: dict[str, Row] = {}
    events: list[Row] = []
    changed: list[Row] = []
    if not reason.terminal:
        # SUSPENDED, SHUTDOWN: only a running task without a request yet is asked to stop.
        for chunk in _chunks(targets):
            params = [reason.value, now, *chunk]
            for row in conn.execute(sql.request_stop_sql(len(chunk)), params):
                rows[row[ID]] = row
        changed = [rows[i] for i in targets if i in rows]
        events += [(r[SEQ], r[ID], _CANCEL_REQUESTED, "running", now) for r in changed]
        if events:
            insert_events(conn, events)
        return [task(r) for r in changed]

    # A terminal reason: every selected active task ends CANCELLED, processed as if one
    # by one in `targets` order, but with one UPDATE per 500 tasks.
    position = {task_id: n for n, task_id in enumerate(targets)}
    active: list[Row] = []
    for chunk in _chunks(targets):
        active += conn.execute(
            "SELECT seq, id, status, worker_id, attempts, started_at, alias_of FROM tasks "
            f"WHERE id IN ({sql.marks(len(chunk))}) AND status IN ('pending', 'running')",
            chunk,
        ).fetchall()
    # An alias whose (active) leader comes before it is cancelled *by* that leader,
    # taking its result and error as aliases always do; otherwise it is cancelled alone.
    first = {r[1]: position[r[1]] for r in active}
    direct = [r[1] for r in active if first.get(r[6], len(targets)) > position[r[1]]]
    for chunk in _chunks(direct):
        for row in conn.execute(sql.cancel_sql(len(chunk)), [reason.value, now, *chunk]):
            rows[row[ID]] = row
    done: set[str] = set()
    for task_id in targets:
        row = rows.get(task_id)
        if row is None or task_id in done:
            continue
        done.add(task_id)
        changed.append(row)
        events.append((row[SEQ], task_id, _CANCELLED_EVENT, "cancelled", now))
        if leads_aliases(row):
            # Its aliases still PENDING follow it; the dedupe key is free again (the
            # tasks_dedupe_leader index covers active leaders only).
            for alias in _settle_aliases(conn, row, now, events):
                done.add(alias[ID])
                changed.append(alias)
    error = cancel_error(reason)
    cancelled = _CANCELLED_OUTCOME
    log = [
        (
            seq, task_id, attempts, worker_id or "",
            now if started_at is None else started_at, now, cancelled, error,
        )
        for seq, task_id, status, worker_id, attempts, started_at, _ in active
        if status == "running"
    ]  # fmt: skip
    if log:
        conn.executemany(sql.INSERT_ATTEMPT, log)
    if changed:
        changed += settle_dependents(conn, [(r[ID], r[STATUS_COL]) for r in changed], now, events)
    if events:
        insert_events(conn, events)
    return [task(r) for r in changed]


def watch(conn: sqlite3.Connection, leases: Sequence[Lease]) -> dict[str, CancelReason | None]:
    found: dict[str, tuple[str, int, str | None]] = {}
    for chunk in _chunks(leases):
        text = (
            "SELECT id, worker_id, attempts, cancel_reason FROM tasks "
            f"WHERE id IN ({sql.marks(len(chunk))}) AND status = 'running'"
        )
        for task_id, worker_id, attempts, reason in conn.execute(text, [x.task_id for x in chunk]):
            found[task_id] = (worker_id, attempts, reason)
    held: dict[str, CancelReason | None] = {}
    for lease in leases:
        row = found.get(lease.task_id)
        if row is not None and row[0] == lease.worker_id and row[1] == lease.attempt:
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
    snapshots: dict[str, Task] = {}
    events: list[TaskEvent] = []
    start = EVENT_COLUMNS
    for row in rows:
        task_id = row[start + ID]
        if task_id is None:
            continue  # the task was deleted since (cleanup): skipped, cursor moves on
        snapshot = snapshots.get(task_id)
        if snapshot is None:
            snapshot = snapshots[task_id] = task(row[start:])
        events.append(event(row, snapshot))
    return events, position_token(int(rows[-1][0]))


def prune_events(conn: sqlite3.Connection, older_than: timedelta) -> int:
    cutoff = now_us() - older_than // ONE_US
    # `at` is read under the writer lock, so it only grows with seq (unless the wall
    # clock steps back): the events to delete are the prefix of the log before the first
    # young one, found by walking exactly that prefix. After a clock step back this
    # keeps some old events until a later prune; it never deletes a young one.
    first_young = conn.execute(sql.FIRST_YOUNG_EVENT, (cutoff,)).fetchone()
    if first_young is None:
        return conn.execute("DELETE FROM events WHERE at < ?", (cutoff,)).rowcount
    return conn.execute("DELETE FROM events WHERE seq < ?", (first_young[0],)).rowcount
