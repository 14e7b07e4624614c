"""``sqlite:///path`` — the embedded default storage, safe for several worker processes.

Design:

- One stdlib :mod:`sqlite3` connection per storage object, owned by one dedicated
  thread (a single-worker :class:`~concurrent.futures.ThreadPoolExecutor`). Every domain
  operation is one synchronous function run on that thread: one thread hop per
  operation, whatever its number of statements.
- Every write operation is one transaction opened with ``BEGIN IMMEDIATE``, which takes
  SQLite's writer lock up front (waiting up to ``busy_timeout``). Reads and writes of
  one operation therefore see one consistent state, and writers in other processes
  are serialised by SQLite itself: a claim is a single ``UPDATE ... RETURNING`` inside
  that transaction, so no task is ever returned to two callers, in this process or
  any other.
- The database runs in WAL mode with ``synchronous=NORMAL``: readers never block the
  writer and a committed transaction survives a process crash.
- Timestamps are stored as INTEGER microseconds since the epoch (UTC), JSON values as
  text, enums by value; creation order is the table's rowid (``seq``).
- Every state change appends its row to the ``events`` table in the transaction that
  makes it. The writer lock orders those transactions across processes, so the
  AUTOINCREMENT ``seq`` of an event is its commit order: the event cursor.
- Suspensions live in the ``suspensions`` table; each claim reads it inside its own
  transaction and leaves the suspended scopes out of its statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Self, TypeVar
from urllib.parse import parse_qsl, quote, unquote

from taskmill.backends.sqlite import registrations, schema
from taskmill.errors import (
    InvalidTransition,
    InvalidURL,
    StorageUnavailable,
    TaskNotFound,
)
from taskmill.model import (
    NO_PROGRESS,
    Attempt,
    AttemptOutcome,
    CancelReason,
    EventKind,
    Progress,
    ProgressSummary,
    SuspensionScope,
    Task,
    TaskEvent,
    TaskFilter,
    TaskStatus,
)
from taskmill.serialization import dumps
from taskmill.storage import (
    ClaimRequest,
    Finish,
    FinishKind,
    HandlerKey,
    HandlerRegistration,
    Lease,
    NewTask,
    ProgressUpdate,
    StorageCapabilities,
    TaskStorage,
)

__all__ = ["SQLiteStorage", "claim_statement"]

T = TypeVar("T")
Row = tuple[Any, ...]

MIN_SQLITE_VERSION: Final = (3, 35, 0)
"""RETURNING (3.35) is what makes a claim one statement."""

DEFAULT_BUSY_TIMEOUT: Final = 30.0
_SYNCHRONOUS_MODES: Final = ("OFF", "NORMAL", "FULL", "EXTRA")
VALID_OPTIONS: Final = {
    "busy_timeout": "seconds to wait for another process's write lock (default 30)",
    "synchronous": "SQLite synchronous mode: OFF, NORMAL (default), FULL or EXTRA",
}
URL_FORM: Final = (
    "sqlite:///relative/path.db (relative to the current directory) or sqlite:////absolute/path.db"
)
_SQLITE_HEADER: Final = b"SQLite format 3\x00"

# -- conversions -------------------------------------------------------------------

_fromtimestamp = datetime.fromtimestamp
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US: Final = timedelta(microseconds=1)
_STATUS: Final = {s.value: s for s in TaskStatus}
_REASON: Final = {r.value: r for r in CancelReason}
_OUTCOME: Final = {o.value: o for o in AttemptOutcome}
_TERMINAL_VALUES: Final = frozenset({"completed", "failed", "cancelled"})
_KIND: Final = {k.value: k for k in EventKind}
# The event of a transition to each status, for leaders reaching it and their aliases.
_TERMINAL_EVENT: Final = {
    "completed": EventKind.COMPLETED.value,
    "failed": EventKind.FAILED.value,
    "cancelled": EventKind.CANCELLED.value,
}
_FINISH_EVENT: Final = {
    FinishKind.COMPLETE: EventKind.COMPLETED.value,
    FinishKind.RETRY: EventKind.RETRYING.value,
    FinishKind.FAIL: EventKind.FAILED.value,
    FinishKind.RELEASE: EventKind.REQUEUED.value,
    FinishKind.CANCEL: EventKind.CANCELLED.value,
}
_REQUEUED: Final = EventKind.REQUEUED.value


loads: Final = json.JSONDecoder().decode
"""json.loads without its wrapper: the stored JSON text was written by
:func:`taskmill.serialization.dumps`."""


def _now_us() -> int:
    """The store clock (``time.time()``) in integer microseconds."""
    return time.time_ns() // 1000


def _dt(us: int) -> datetime:
    """A tz-aware UTC datetime from stored microseconds (exact for any real date)."""
    return _fromtimestamp(us / 1e6, UTC)


def _us(value: datetime) -> int:
    """Stored microseconds of a tz-aware datetime (exact)."""
    if value.utcoffset() is None:
        raise ValueError(f"a timezone-aware datetime is required, got {value!r}")
    return (value - _EPOCH) // _ONE_US


TASK_COLUMNS: Final = (
    "seq, id, task_type, status, created_at, run_at, updated_at, app_id, params, data, "
    "priority, attempts, max_retries, result, error, progress_done, progress_total, "
    "progress_message, dedupe_key, alias_of, parent_id, user_id, cancel_reason, "
    "started_at, finished_at, worker_id, lease_expires_at"
)
# Positions in TASK_COLUMNS used outside _task().
_SEQ, _ID, _STATUS_COL, _PRIORITY, _RESULT, _ERROR = 0, 1, 3, 10, 13, 14
_DEDUPE_KEY, _ALIAS_OF, _CANCEL_REASON = 18, 19, 22


def _task(r: Row) -> Task:
    """The snapshot of one row selected as TASK_COLUMNS."""
    data = r[9]
    result = r[13]
    done, total, message = r[15], r[16], r[17]
    reason = r[22]
    started, finished, lease = r[23], r[24], r[26]
    return Task(
        id=r[1],
        task_type=r[2],
        status=_STATUS[r[3]],
        created_at=_fromtimestamp(r[4] / 1e6, UTC),
        run_at=_fromtimestamp(r[5] / 1e6, UTC),
        updated_at=_fromtimestamp(r[6] / 1e6, UTC),
        app_id=r[7],
        params=loads(r[8]),
        data={} if data == "{}" else loads(data),
        priority=r[10],
        attempts=r[11],
        max_retries=r[12],
        result=None if result is None or result == "null" else loads(result),
        error=r[14],
        progress=(
            NO_PROGRESS
            if done == 0 and total is None and message is None
            else Progress(done, total, message)
        ),
        dedupe_key=r[18],
        alias_of=r[19],
        parent_id=r[20],
        user_id=r[21],
        cancel_reason=None if reason is None else _REASON[reason],
        started_at=None if started is None else _fromtimestamp(started / 1e6, UTC),
        finished_at=None if finished is None else _fromtimestamp(finished / 1e6, UTC),
        worker_id=r[25],
        lease_expires_at=None if lease is None else _fromtimestamp(lease / 1e6, UTC),
    )


def _sorted_tasks(rows: list[Row]) -> list[Task]:
    """Snapshots of RETURNING rows (whose order SQLite leaves unspecified) in claim
    order: priority DESC, then creation."""
    rows.sort(key=lambda r: (-r[_PRIORITY], r[_SEQ]))
    return [_task(r) for r in rows]


# -- SQL ---------------------------------------------------------------------------

_INSERT: Final = (
    "INSERT INTO tasks (id, task_type, status, created_at, run_at, updated_at, app_id, "
    "params, priority, max_retries, dedupe_key, alias_of, parent_id, user_id) "
    "VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_FIND_LEADER: Final = (
    "SELECT id FROM tasks WHERE ifnull(app_id, x'') = ? AND task_type = ? "
    "AND dedupe_key = ? AND alias_of IS NULL AND status IN ('pending', 'running')"
)
_SELECT_TASK: Final = f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?"
_FENCE: Final = " WHERE id = ? AND status = 'running' AND worker_id = ? AND attempts = ?"
_INSERT_ATTEMPT: Final = (
    "INSERT INTO attempts (task_seq, task_id, number, worker_id, started_at, finished_at, "
    "outcome, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_SETTLE_ALIASES: Final = (
    "UPDATE tasks SET status = ?, result = ?, error = ?, cancel_reason = ?, "
    "finished_at = ?, updated_at = ? WHERE alias_of = ? AND status = 'pending' "
    f"RETURNING {TASK_COLUMNS}"
)
_RENEW: Final = f"UPDATE tasks SET lease_expires_at = ?{_FENCE} RETURNING id, cancel_reason"
_ATTEMPTS: Final = (
    "SELECT task_id, number, worker_id, started_at, finished_at, outcome, error "
    "FROM attempts WHERE task_seq = (SELECT seq FROM tasks WHERE id = ?1) "
    "AND task_id = ?1 ORDER BY id"
)
_CLAIMABLE: Final = "status = 'pending' AND alias_of IS NULL"

# Finishes are applied in batches: one UPDATE ... FROM (VALUES ...) per finish kind,
# joined on the task id and fenced by (RUNNING, worker id, attempt). Each VALUES row is
# (id, worker_id, attempt, result, run_at, error, cancel_reason, data, has_progress,
# done, total, message); ?1 is the store clock.
_NO_PROGRESS: Final = "progress_done = 0, progress_total = NULL, progress_message = NULL"
_FINISH_SETS: Final = {
    FinishKind.COMPLETE: (
        "status = 'completed', finished_at = ?1, result = v.column4, error = NULL, "
        "cancel_reason = NULL"
    ),
    FinishKind.RETRY: (
        f"status = 'pending', run_at = v.column5, error = v.column6, {_NO_PROGRESS}"
    ),
    FinishKind.FAIL: "status = 'failed', finished_at = ?1, error = v.column6",
    FinishKind.RELEASE: (
        "status = 'pending', attempts = attempts - 1, run_at = ?1, cancel_reason = NULL, "
        f"{_NO_PROGRESS}"
    ),
    FinishKind.CANCEL: (
        "status = 'cancelled', finished_at = ?1, cancel_reason = v.column7, error = v.column6"
    ),
}
_FINISH_COMMON: Final = (
    "updated_at = ?1, worker_id = NULL, lease_expires_at = NULL, "
    "data = coalesce(v.column8, tasks.data)"
)
_FINISH_PROGRESS: Final = (
    "progress_done = CASE WHEN v.column9 THEN v.column10 ELSE tasks.progress_done END, "
    "progress_total = CASE WHEN v.column9 THEN v.column11 ELSE tasks.progress_total END, "
    "progress_message = CASE WHEN v.column9 THEN v.column12 ELSE tasks.progress_message END"
)
"""A terminal finish keeps the attempt's last progress; a requeue resets it instead."""
_REQUEUES: Final = frozenset({FinishKind.RETRY, FinishKind.RELEASE})
_FINISH_WIDTH: Final = 12
_FINISH_PAD: Final = (None,) * _FINISH_WIDTH
_FINISH_CHUNK: Final = 128
_finish_sql_cache: dict[tuple[FinishKind, int], str] = {}


def _finish_sql(kind: FinishKind, rows: int) -> str:
    """The batched finish statement of ``kind`` for ``rows`` VALUES rows."""
    cached = _finish_sql_cache.get((kind, rows))
    if cached is not None:
        return cached
    row = "(" + ", ".join("?" * _FINISH_WIDTH) + ")"
    # `+status`: the unary plus keeps the status test from selecting the partial index
    # tasks_lease (WHERE status = 'running'). With statistics taken while one task was
    # RUNNING, SQLite read every RUNNING task through it and scanned the VALUES once per
    # task (11 ms per finished row with 50,000 RUNNING); rows are found by id instead.
    where = (
        "tasks.id = v.column1 AND +tasks.status = 'running' "
        "AND tasks.worker_id = v.column2 AND tasks.attempts = v.column3"
    )
    if kind is FinishKind.RETRY or kind is FinishKind.FAIL:
        # A RUNNING task with a pending cancel request is released instead (see
        # _finish); the RELEASE statement is tried for what this one did not match.
        where += " AND tasks.cancel_reason IS NULL"
    sql = (
        f"UPDATE tasks SET {_FINISH_SETS[kind]}, {_FINISH_COMMON}"
        f"{'' if kind in _REQUEUES else ', ' + _FINISH_PROGRESS} "
        f"FROM (VALUES {', '.join([row] * rows)}) AS v WHERE {where} "
        f"RETURNING {TASK_COLUMNS}"
    )
    _finish_sql_cache[(kind, rows)] = sql
    return sql


def _bucket(n: int) -> int:
    """Round a batch size up to a power of two (padding rows match nothing), so that
    only a handful of distinct statements is ever prepared."""
    size = 1
    while size < n:
        size *= 2
    return size


def _progress_sql(with_progress: bool, with_data: bool) -> str:
    sets = "updated_at = ?"
    if with_progress:
        sets += ", progress_done = ?, progress_total = ?, progress_message = ?"
    if with_data:
        sets += ", data = ?"
    return f"UPDATE tasks SET {sets}{_FENCE} RETURNING seq"


_PROGRESS_SQL: Final = {(p, d): _progress_sql(p, d) for p in (False, True) for d in (False, True)}

_RESCUE_SELECT: Final = (
    "SELECT seq, id, worker_id, attempts, max_retries, started_at, cancel_reason FROM tasks "
    "WHERE status = 'running' AND lease_expires_at <= ? ORDER BY lease_expires_at LIMIT ?"
)
_RESCUE_CANCELLED: Final = (
    "UPDATE tasks SET status = 'cancelled', finished_at = ?, updated_at = ?, "
    f"worker_id = NULL, lease_expires_at = NULL WHERE id = ? RETURNING {TASK_COLUMNS}"
)
_RESCUE_RELEASED: Final = (
    "UPDATE tasks SET status = 'pending', attempts = attempts - 1, run_at = ?, "
    "updated_at = ?, cancel_reason = NULL, worker_id = NULL, lease_expires_at = NULL, "
    f"{_NO_PROGRESS} WHERE id = ? RETURNING {TASK_COLUMNS}"
)
_RESCUE_REQUEUED: Final = (
    "UPDATE tasks SET status = 'pending', run_at = ?, updated_at = ?, error = ?, "
    f"worker_id = NULL, lease_expires_at = NULL, {_NO_PROGRESS} WHERE id = ? "
    f"RETURNING {TASK_COLUMNS}"
)
_RESCUE_FAILED: Final = (
    "UPDATE tasks SET status = 'failed', finished_at = ?, updated_at = ?, error = ?, "
    f"worker_id = NULL, lease_expires_at = NULL WHERE id = ? RETURNING {TASK_COLUMNS}"
)
_REDRIVE: Final = (
    "UPDATE tasks SET status = 'pending', attempts = 0, result = NULL, error = NULL, "
    "cancel_reason = NULL, progress_done = 0, progress_total = NULL, "
    "progress_message = NULL, run_at = ?, updated_at = ?, started_at = NULL, "
    f"finished_at = NULL WHERE id = ? RETURNING {TASK_COLUMNS}"
)

_CLAIM_UPDATE: Final = (
    "UPDATE tasks SET status = 'running', attempts = attempts + 1, worker_id = ?, "
    "started_at = ?, updated_at = ?, lease_expires_at = ? WHERE seq IN "
)
# Per handler-key shape: (app-specific key?, number of apps excluded from a host key).
_ClaimShape = tuple[tuple[bool, int], ...]
_claim_sql_cache: dict[tuple[_ClaimShape, bool], str] = {}


def _claim_source(columns: str, app_key: bool, excluded: int, min_priority: bool) -> str:
    if app_key:
        app = " AND app_id = ?"
    elif excluded:
        app = f" AND (app_id IS NULL OR app_id NOT IN ({', '.join('?' * excluded)}))"
    else:
        app = ""
    prio = " AND priority >= ?" if min_priority else ""
    return (
        f"SELECT {columns} FROM tasks WHERE {_CLAIMABLE} AND task_type = ?{app} "
        f"AND run_at <= ?{prio} ORDER BY priority DESC, seq LIMIT ?"
    )


def _claim_sql(shape: _ClaimShape, min_priority: bool) -> str:
    cached = _claim_sql_cache.get((shape, min_priority))
    if cached is not None:
        return cached
    if len(shape) == 1:
        ((app_key, excluded),) = shape
        chosen = _claim_source("seq", app_key, excluded, min_priority)
    else:
        union = " UNION ALL ".join(
            f"SELECT * FROM ({_claim_source('seq, priority', a, e, min_priority)})"
            for a, e in shape
        )
        chosen = f"SELECT seq FROM ({union}) ORDER BY priority DESC, seq LIMIT ?"
    sql = f"{_CLAIM_UPDATE}({chosen}) RETURNING {TASK_COLUMNS}"
    _claim_sql_cache[(shape, min_priority)] = sql
    return sql


def claim_statement(
    request: ClaimRequest, now_us: int, suspended: Sequence[SuspensionScope] = ()
) -> tuple[str, list[Any]] | None:
    """The one ``UPDATE ... RETURNING`` statement (and its parameters) that serves
    ``request`` at time ``now_us`` while ``suspended`` are stored; None when the request
    cannot claim anything.

    Each handler key draws at most its cap (or ``limit``) of its best due tasks through
    the ``tasks_claim`` partial index; a task of an app with its own key is served only
    by that key, never by the host key. The union is cut to ``limit`` by priority DESC,
    then creation.

    Suspensions are folded into the statement's shape rather than tested per row: a
    handler key whose whole scope is suspended is left out, and the apps suspended for a
    task type are excluded from its host key the way apps with their own key are. A
    correlated ``NOT EXISTS (SELECT ... FROM suspensions)`` per candidate would do the
    same, but under a global or type-wide suspension every claim would then walk the
    whole pending backlog of the suspended types through the index (while holding the
    writer lock) only to reject each row; this way such a claim touches nothing.
    ``_claim`` reads the suspensions inside the claim's own ``BEGIN IMMEDIATE``
    transaction, so a suspension committed by any process stops every later claim.
    """
    limit = request.limit
    if limit <= 0:
        return None
    handlers = request.handlers
    own_keys: dict[str, list[str]] = {}
    for app_id, task_type in handlers:
        if app_id is not None:
            own_keys.setdefault(task_type, []).append(app_id)
    min_priority = request.min_priority
    shape: list[tuple[bool, int]] = []
    params: list[Any] = [
        request.worker_id,
        now_us,
        now_us,
        now_us + round(request.lease_seconds * 1e6),
    ]
    for (app_id, task_type), cap in handlers.items():
        take = limit if cap is None else min(cap, limit)
        if take <= 0:
            continue
        if suspended and any(s.covers(app_id, task_type) for s in suspended):
            continue
        if app_id is not None:
            shape.append((True, 0))
            params += (task_type, app_id)
        else:
            excluded: Sequence[str] = own_keys.get(task_type, ())
            if suspended:
                # (the scopes naming no app covered the host key: it was skipped above)
                apps = dict.fromkeys(excluded)
                for scope in suspended:
                    if scope.app_id is not None and scope.task_type in (None, task_type):
                        apps[scope.app_id] = None
                excluded = list(apps)
            shape.append((False, len(excluded)))
            params.append(task_type)
            params += excluded
        params.append(now_us)
        if min_priority is not None:
            params.append(min_priority)
        params.append(take)
    if not shape:
        return None
    if len(shape) > 1:
        params.append(limit)
    return _claim_sql(tuple(shape), min_priority is not None), params


def _filter_sql(f: TaskFilter) -> tuple[str, list[Any]]:
    """A WHERE clause (possibly empty) selecting what ``f`` selects."""
    clauses: list[str] = []
    params: list[Any] = []
    if f.app_id is not None:
        clauses.append("app_id = ?")
        params.append(f.app_id)
    if f.task_types is not None:
        if f.task_types:
            clauses.append(f"task_type IN ({', '.join('?' * len(f.task_types))})")
            params += f.task_types
        else:
            clauses.append("0")
    if f.statuses is not None:
        if f.statuses:
            clauses.append(f"status IN ({', '.join('?' * len(f.statuses))})")
            params += (s.value for s in f.statuses)
        else:
            clauses.append("0")
    for column, value in (
        ("parent_id", f.parent_id),
        ("user_id", f.user_id),
        ("dedupe_key", f.dedupe_key),
    ):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if f.created_after is not None:
        clauses.append("created_at > ?")
        params.append(_us(f.created_after))
    if f.created_before is not None:
        clauses.append("created_at < ?")
        params.append(_us(f.created_before))
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


# -- control and the event log ------------------------------------------------------

# Every write operation appends the events of its changes in its own BEGIN IMMEDIATE
# transaction: a reader never sees a change without its event, and since SQLite
# serialises writers (of every process) the AUTOINCREMENT seq of a later commit is
# always larger than every seq already committed. Cursors therefore increase in commit
# order and no event ever appears behind a cursor a reader already holds.
_INSERT_EVENT: Final = (
    "INSERT INTO events (task_seq, task_id, kind, status, at) VALUES (?, ?, ?, ?, ?)"
)
_EVENT_WIDTH: Final = 5
_EVENT_PAD: Final = (None,) * _EVENT_WIDTH
_EVENT_CHUNK: Final = 128
_event_sql_cache: dict[int, str] = {}


def _events_sql(rows: int) -> str:
    """One INSERT of ``rows`` events from a VALUES list; all-NULL padding rows are
    dropped by the WHERE."""
    cached = _event_sql_cache.get(rows)
    if cached is None:
        row = "(" + ", ".join("?" * _EVENT_WIDTH) + ")"
        cached = _event_sql_cache[rows] = (
            "INSERT INTO events (task_seq, task_id, kind, status, at) "
            "SELECT column1, column2, column3, column4, column5 "
            f"FROM (VALUES {', '.join([row] * rows)}) WHERE column1 IS NOT NULL"
        )
    return cached


def _insert_events(conn: sqlite3.Connection, events: list[Row]) -> None:
    """Append ``events`` (task_seq, task_id, kind, status, at), in order.

    A batch is one multi-row statement per 128 events rather than ``executemany``,
    which runs the statement (and the AUTOINCREMENT bookkeeping in sqlite_sequence)
    once per row: this is on the claim and finish paths, two events per task. Sizes
    are rounded up to a multiple of 8 (at most 23 distinct statements): padding to a
    power of two, as the finishes do, made a batch of 100 events cost 40% more.
    """
    if len(events) == 1:
        conn.execute(_INSERT_EVENT, events[0])
        return
    for start in range(0, len(events), _EVENT_CHUNK):
        chunk = events[start : start + _EVENT_CHUNK]
        size = len(chunk) if len(chunk) <= 8 else -(-len(chunk) // 8) * 8
        params: list[Any] = []
        for event in chunk:
            params += event
        for _ in range(size - len(chunk)):
            params += _EVENT_PAD
        conn.execute(_events_sql(size), params)


# The tasks one enqueue inserted are exactly those above the largest seq read before
# inserting (under the writer lock, a new rowid is the largest one plus one).
_ENQUEUE_EVENTS: Final = (
    "INSERT INTO events (task_seq, task_id, kind, status, at) "
    "SELECT seq, id, 'enqueued', 'pending', ? FROM tasks WHERE seq > ? ORDER BY seq"
)
_LAST_TASK_SEQ: Final = "SELECT ifnull(max(seq), 0) FROM tasks"
_EVENTS_CURSOR: Final = "SELECT seq FROM sqlite_sequence WHERE name = 'events'"
# The snapshot columns again, qualified for the join with events.
_T_COLUMNS: Final = ", ".join(f"t.{c.strip()}" for c in TASK_COLUMNS.split(","))
_READ_EVENTS: Final = (
    f"SELECT e.seq, e.kind, e.status, e.at, {_T_COLUMNS} FROM events AS e "
    "LEFT JOIN tasks AS t ON t.seq = e.task_seq AND t.id = e.task_id "
    "WHERE e.seq > ? ORDER BY e.seq LIMIT ?"
)
_EVENT_TASK: Final = 4  # where the task's columns start in a _READ_EVENTS row
_FIRST_YOUNG_EVENT: Final = "SELECT seq FROM events WHERE at >= ? ORDER BY seq LIMIT 1"

_SUSPENSIONS: Final = "SELECT task_type, app_id FROM suspensions"
_SUSPEND: Final = (
    "INSERT OR IGNORE INTO suspensions (task_type, app_id, created_at) VALUES (?, ?, ?)"
)
_RESUME: Final = "DELETE FROM suspensions WHERE task_type IS ? AND app_id IS ?"

_CHUNK: Final = 500
"""Most ids bound in one ``IN (...)`` list (SQLite before 3.32 allows 999 variables)."""


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def _cancel_sql(n: int) -> str:
    return (
        "UPDATE tasks SET status = 'cancelled', cancel_reason = ?, finished_at = ?, "
        "updated_at = ?, worker_id = NULL, lease_expires_at = NULL "
        f"WHERE id IN ({_marks(n)}) AND status IN ('pending', 'running') "
        f"RETURNING {TASK_COLUMNS}"
    )


def _request_stop_sql(n: int) -> str:
    return (
        "UPDATE tasks SET cancel_reason = ?, updated_at = ? "
        f"WHERE id IN ({_marks(n)}) AND status = 'running' AND cancel_reason IS NULL "
        f"RETURNING {TASK_COLUMNS}"
    )


# -- URL -----------------------------------------------------------------------------


def _parse_options(raw: dict[str, Any]) -> tuple[float, str]:
    unknown = sorted(set(raw) - set(VALID_OPTIONS))
    if unknown:
        valid = "; ".join(f"{name}: {doc}" for name, doc in VALID_OPTIONS.items())
        raise InvalidURL(
            f"unknown sqlite:// option(s): {', '.join(unknown)}; valid options are: {valid}"
        )
    busy = raw.get("busy_timeout", DEFAULT_BUSY_TIMEOUT)
    try:
        busy_timeout = float(busy)
    except (TypeError, ValueError):
        busy_timeout = -1.0
    if not 0 <= busy_timeout < 1e9:
        raise InvalidURL(
            f"sqlite:// option busy_timeout must be a number of seconds >= 0, got {busy!r}"
        )
    synchronous = str(raw.get("synchronous", "NORMAL")).upper()
    if synchronous not in _SYNCHRONOUS_MODES:
        raise InvalidURL(
            f"sqlite:// option synchronous must be one of {', '.join(_SYNCHRONOUS_MODES)}, "
            f"got {raw['synchronous']!r}"
        )
    return busy_timeout, synchronous


def _parse_url(url: str) -> tuple[str, dict[str, str]]:
    """The absolute database path and the query-string options of a sqlite:// URL."""
    if not isinstance(url, str) or not url.lower().startswith("sqlite://"):
        raise InvalidURL(f"not a sqlite URL: {url!r}; expected {URL_FORM}")
    rest = url[len("sqlite://") :].split("#", 1)[0]
    rest, _, query = rest.partition("?")
    if not rest.startswith("/"):
        if rest:
            raise InvalidURL(f"a sqlite URL has no host part, got {url!r}; expected {URL_FORM}")
        raise InvalidURL(f"the sqlite URL {url!r} names no database file; expected {URL_FORM}")
    path = unquote(rest[1:])
    if not path:
        raise InvalidURL(f"the sqlite URL {url!r} names no database file; expected {URL_FORM}")
    if path == ":memory:" or path.startswith("file:"):
        raise InvalidURL(
            f"{url!r} is not supported: taskmill's SQLite storage needs a database file "
            f"({URL_FORM}); use memory:// for an in-process store"
        )
    options = dict(parse_qsl(query, keep_blank_values=True))
    return os.path.abspath(path), options


# -- the storage ---------------------------------------------------------------------


class SQLiteStorage(TaskStorage):
    """Task storage in one SQLite database file, shared safely by several processes.

    Guarantees, beyond :class:`~taskmill.storage.TaskStorage`'s:

    - Each operation is one transaction on a dedicated database thread; writes take
      the writer lock up front (``BEGIN IMMEDIATE``), so concurrent workers in other
      processes never both claim a task and never interleave inside an operation.
    - Committed work survives a crash of the process (WAL, ``synchronous=NORMAL``:
      power loss may lose the last transactions but never corrupts the file).
    - It never creates, modifies or truncates a file that is not a taskmill database.

    Build it with :meth:`from_url`; call :meth:`open` before use and :meth:`close` after.
    """

    capabilities = StorageCapabilities(
        durable=True,
        shared_between_processes=True,
        notifications=False,
        transactions_across_records=True,
        commit_ordered_cursors=True,
        handler_registrations=True,
    )

    def __init__(
        self,
        path: str,
        *,
        url: str | None = None,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        synchronous: str = "NORMAL",
    ) -> None:
        self.path = os.path.abspath(path)
        self.url = url or f"sqlite:///{self.path}"
        self.busy_timeout = busy_timeout
        self.synchronous = synchronous
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Build a storage for ``sqlite:///relative/path.db`` (relative to the current
        directory) or ``sqlite:////absolute/path.db`` without touching the file.

        Options, as keyword arguments or in the query string (keywords win):
        ``busy_timeout`` (seconds, default 30) and ``synchronous`` (default NORMAL).

        :raises InvalidURL: the URL has no path or a host, or an option is unknown or
            invalid (the message lists the valid ones).
        """
        path, from_query = _parse_url(url)
        busy_timeout, synchronous = _parse_options({**from_query, **options})
        return cls(path, url=url, busy_timeout=busy_timeout, synchronous=synchronous)

    def __repr__(self) -> str:
        return f"SQLiteStorage({self.url!r})"

    async def exists(self) -> bool:
        """Whether the database file exists (:meth:`open` would create it)."""
        return await asyncio.to_thread(os.path.exists, self.path)

    # -- lifecycle -------------------------------------------------------------------

    async def open(self, *, auto_migrate: bool = False) -> None:
        """Open the database file, creating it (and the schema) when it does not exist.

        An empty database gets the current schema. A database at an older schema
        version is migrated only when ``auto_migrate`` is true. Opening an open storage
        does nothing.

        :raises SchemaVersionError: the stored schema is older (without
            ``auto_migrate``; the message names ``taskmill migrate --url ...``) or newer
            than this code.
        :raises StorageUnavailable: the directory is missing or not writable, the file is
            not a SQLite database, or it is a SQLite database that is not taskmill's.
            Such a file is left untouched.
        """
        if self._executor is not None:
            return
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskmill-sqlite")
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(executor, self._open_sync, auto_migrate)
        except BaseException:
            # Also when open() itself was cancelled: the thread closes what it opened.
            executor.submit(self._close_sync)
            executor.shutdown(wait=False)
            raise
        self._executor = executor

    async def close(self) -> None:
        """Close the connection and stop the database thread. Safe to call twice;
        operations called afterwards raise :class:`StorageUnavailable`."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._close_sync)
        finally:
            executor.shutdown(wait=True)

    async def migrate(self) -> int:
        """Apply pending migrations in one ``BEGIN IMMEDIATE`` transaction and return
        the schema version now in place. Works on an open or a closed storage (the
        latter is what ``taskmill migrate`` uses on a database ``open`` refuses).

        Idempotent, and safe when several processes run it at once: the second waits
        for the first's transaction and then finds nothing to do.

        :raises SchemaVersionError: the stored schema is newer than this code.
        :raises StorageUnavailable: the file cannot be opened or is not a taskmill
            database.
        """
        if self._executor is not None:
            return await self._run(self._migrate_open)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskmill-sqlite")
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(executor, self._migrate_closed)
        finally:
            executor.shutdown(wait=True)

    # -- thread side: connections ------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """Check the path and connect, without writing anything to the file."""
        if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
            raise StorageUnavailable(
                f"taskmill's SQLite storage needs SQLite "
                f"{'.'.join(map(str, MIN_SQLITE_VERSION))} or newer; this Python uses "
                f"{sqlite3.sqlite_version}"
            )
        path = self.path
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            raise StorageUnavailable(
                f"cannot open {path}: the directory {directory} does not exist; create it "
                "first or choose another path"
            )
        if not os.access(directory, os.W_OK | os.X_OK):
            raise StorageUnavailable(
                f"cannot open {path}: the directory {directory} is not writable (SQLite "
                "keeps its -wal and -shm files next to the database)"
            )
        exists = os.path.exists(path)
        if exists:
            if not os.path.isfile(path):
                raise StorageUnavailable(f"cannot open {path}: it is not a regular file")
            try:
                with open(path, "rb") as handle:
                    header = handle.read(len(_SQLITE_HEADER))
            except OSError as exc:
                raise StorageUnavailable(f"cannot read {path}: {exc}") from exc
            if header and header != _SQLITE_HEADER:
                raise StorageUnavailable(
                    f"{path} is not a SQLite database; taskmill will not touch it. Point "
                    "the URL at a new file or an existing taskmill database"
                )
            if not os.access(path, os.W_OK):
                raise StorageUnavailable(f"cannot open {path}: the file is not writable")
        mode = "rw" if exists else "rwc"
        try:
            conn = sqlite3.connect(
                f"file:{quote(path)}?mode={mode}",
                uri=True,
                timeout=self.busy_timeout,
                isolation_level=None,
                cached_statements=512,
            )
        except sqlite3.Error as exc:
            raise StorageUnavailable(f"cannot open the SQLite database {path}: {exc}") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {round(self.busy_timeout * 1000)}")
            schema.user_tables(conn)  # reads the header: fails on a foreign file
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StorageUnavailable(
                f"{path} is not a usable SQLite database ({exc}); taskmill will not touch it"
            ) from exc
        return conn

    def _configure(self, conn: sqlite3.Connection) -> None:
        # Switching a fresh file to WAL needs an exclusive lock, and SQLite reports a
        # busy database here without calling the busy handler: retry until the timeout.
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                mode = None
            if (mode is not None and str(mode).lower() == "wal") or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")

    def _open_sync(self, auto_migrate: bool) -> None:
        conn = self._connect()
        try:
            self._check_schema(conn, auto_migrate)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _check_schema(self, conn: sqlite3.Connection, auto_migrate: bool) -> None:
        path = self.path
        try:
            tables = schema.user_tables(conn)
            version = schema.stored_version(conn, path)
            if version is None:
                raise schema.foreign_database_error(path, tables)
            expected = schema.latest_version()
            if version > expected:
                raise schema.newer_version_error(path, version, expected)
            if version < expected and tables and not auto_migrate:
                raise schema.older_version_error(path, self.url, version, expected)
            self._configure(conn)
            if version < expected:
                schema.apply_pending(conn, path)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.IntegrityError):
                raise
            raise StorageUnavailable(f"cannot prepare the database {path}: {exc}") from exc

    def _migrate_closed(self) -> int:
        conn = self._connect()
        try:
            return self._migrate_with(conn, configure=True)
        finally:
            conn.close()

    def _migrate_open(self) -> int:
        assert self._conn is not None
        return self._migrate_with(self._conn, configure=False)

    def _migrate_with(self, conn: sqlite3.Connection, *, configure: bool) -> int:
        try:
            tables = schema.user_tables(conn)
            if tables and schema.META_TABLE not in tables:
                raise schema.foreign_database_error(self.path, tables)
            if configure:
                self._configure(conn)
            return schema.apply_pending(conn, self.path)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.IntegrityError):
                raise
            raise StorageUnavailable(f"cannot migrate the database {self.path}: {exc}") from exc

    def _close_sync(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # -- thread side: running operations -------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the database thread (one hop) and map SQLite errors."""
        executor = self._executor
        if executor is None:
            raise StorageUnavailable(
                f"the SQLite storage {self.url} is not open; await storage.open() first"
            )
        return await asyncio.get_running_loop().run_in_executor(executor, self._guarded, fn, args)

    def _guarded(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        try:
            return fn(*args)
        except sqlite3.OperationalError as exc:
            hint = ""
            if "locked" in str(exc) or "busy" in str(exc):
                hint = (
                    f" (another process held the write lock longer than busy_timeout="
                    f"{self.busy_timeout:g}s; raise it with ?busy_timeout=SECONDS)"
                )
            raise StorageUnavailable(f"SQLite error on {self.path}: {exc}{hint}") from exc
        except sqlite3.DatabaseError as exc:
            if type(exc) is not sqlite3.DatabaseError:
                raise
            raise StorageUnavailable(f"SQLite error on {self.path}: {exc}") from exc

    def _write(self, fn: Callable[[sqlite3.Connection, Any], T], arg: Any) -> T:
        """Run ``fn(conn, arg)`` as one ``BEGIN IMMEDIATE`` transaction."""
        conn = self._conn
        if conn is None:
            raise StorageUnavailable(f"the SQLite storage {self.url} is closed")
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn, arg)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        return result

    def _read(self, fn: Callable[[sqlite3.Connection, Any], T], arg: Any) -> T:
        conn = self._conn
        if conn is None:
            raise StorageUnavailable(f"the SQLite storage {self.url} is closed")
        return fn(conn, arg)

    # -- writing tasks -----------------------------------------------------------------

    async def enqueue(self, tasks: Sequence[NewTask]) -> list[Task]:
        """Insert ``tasks`` in one transaction (all or none), deciding dedupe leaders
        under the writer lock; the ``tasks_dedupe_leader`` unique index backs this up.

        :returns: the stored snapshots, in the order given.
        """
        if not tasks:
            return []
        return await self._run(self._write, _enqueue, tasks)

    async def claim_batch(self, request: ClaimRequest) -> list[Task]:
        """Claim up to ``request.limit`` due PENDING leaders with one ``UPDATE ...
        RETURNING`` under the writer lock; see :func:`claim_statement`.

        :returns: the claimed snapshots in claim order (priority DESC, then creation).
        """
        if request.limit <= 0 or not request.handlers:
            return []
        return await self._run(self._write, _claim, request)

    async def finish_batch(self, finishes: Sequence[Finish]) -> list[Task | None]:
        """Apply many attempt ends in one transaction, each fenced by (id, RUNNING,
        worker id, attempt); a lost lease yields None and writes nothing."""
        if not finishes:
            return []
        return await self._run(self._write, _finish, finishes)

    async def renew_leases(
        self, leases: Sequence[Lease], lease_seconds: float
    ) -> dict[str, CancelReason | None]:
        """Extend the leases that still hold; map each to its requested cancel reason."""
        if not leases:
            return {}
        return await self._run(self._write, _renew, (leases, lease_seconds))

    async def save_progress(self, updates: Sequence[ProgressUpdate]) -> set[str]:
        """Write progress/data of running tasks whose lease still holds."""
        if not updates:
            return set()
        return await self._run(self._write, _save_progress, updates)

    async def rescue_expired(self, *, limit: int = 1000) -> list[Task]:
        """Take back RUNNING tasks whose lease expired by the store clock
        (``time.time()``); each is rescued once even when every worker runs this."""
        if limit <= 0:
            return []
        return await self._run(self._write, _rescue, limit)

    async def retry(self, task_id: str) -> Task:
        """Redrive a FAILED or CANCELLED leader to PENDING with a fresh budget.

        :raises TaskNotFound: no such task.
        :raises InvalidTransition: the task is active, an alias, or another leader is
            active for its dedupe key.
        """
        return await self._run(self._write, _redrive, task_id)

    # -- reading -----------------------------------------------------------------------

    async def get(self, task_id: str) -> Task | None:
        """The current snapshot of one task, or None."""
        return await self._run(self._read, _get, task_id)

    async def query(
        self,
        filter: TaskFilter,
        *,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
    ) -> list[Task]:
        """Tasks selected by ``filter`` in creation order (rowid), paged in SQL."""
        if limit <= 0:
            return []
        return await self._run(self._read, _query, (filter, limit, max(offset, 0), newest_first))

    async def summary(self, filter: TaskFilter) -> ProgressSummary:
        """Counts by status from one ``GROUP BY status`` query; no task is loaded."""
        return await self._run(self._read, _summary, filter)

    async def attempts(self, task_id: str) -> list[Attempt]:
        """The execution log of one task in insertion order (empty for an unknown id)."""
        return await self._run(self._read, _attempts, task_id)

    async def next_run_at(self, handlers: Sequence[HandlerKey]) -> datetime | None:
        """The earliest ``run_at`` of a claimable PENDING leader for ``handlers``."""
        if not handlers:
            return None
        return await self._run(self._read, _next_run_at, handlers)

    # -- retention ---------------------------------------------------------------------

    async def cleanup(
        self,
        older_than: timedelta,
        *,
        statuses: frozenset[TaskStatus] = frozenset({TaskStatus.COMPLETED, TaskStatus.CANCELLED}),
    ) -> int:
        """Delete terminal tasks in ``statuses`` that finished more than ``older_than``
        ago, with their execution logs, in one transaction.

        Their events stay in the event log until :meth:`prune_events` removes them by
        age; :meth:`read_events` skips them (it joins on the task's rowid *and* id, so a
        rowid reused by a later task never inherits them). Deleting them here would need
        an index on events by task, paid on every event written.

        :raises ValueError: ``statuses`` includes an active status.
        """
        if any(s.active for s in statuses):
            raise ValueError("cleanup deletes terminal tasks only")
        if not statuses:
            return 0
        return await self._run(self._write, _cleanup, (older_than, statuses))

    # -- control -----------------------------------------------------------------------

    async def cancel(
        self,
        *,
        task_ids: Sequence[str] | None = None,
        filter: TaskFilter | None = None,
        reason: CancelReason = CancelReason.USER,
        cascade: bool = True,
    ) -> list[Task]:
        """Cancel (terminal ``reason``) or ask to stop (SUSPENDED, SHUTDOWN) the active
        tasks selected by ``task_ids`` and/or ``filter``, their descendants when
        ``cascade``, and a cancelled leader's aliases; one ``BEGIN IMMEDIATE``
        transaction. See :meth:`TaskStorage.cancel`.

        :raises ValueError: neither ``task_ids`` nor ``filter`` was given.
        :returns: every changed task: the selection and its descendants in that order,
            each cancelled leader followed by its aliases.
        """
        if task_ids is None and filter is None:
            raise ValueError("cancel needs task_ids or a filter")
        ids = None if task_ids is None else list(task_ids)
        return await self._run(self._write, _cancel, (ids, filter, reason, cascade))

    async def watch_leases(self, leases: Sequence[Lease]) -> dict[str, CancelReason | None]:
        """The requested stop (or None) of each lease that still holds; reads only
        (one ``SELECT`` per 500 leases), fenced like :meth:`renew_leases`."""
        if not leases:
            return {}
        return await self._run(self._read, _watch, leases)

    async def suspend(self, scope: SuspensionScope) -> int:
        """Store ``scope`` (idempotent) and ask the running tasks in it to stop, in one
        transaction; claims by every process read the stored suspensions.

        :returns: how many running tasks were asked to stop.
        """
        return await self._run(self._write, _suspend, scope)

    async def resume(self, scope: SuspensionScope) -> bool:
        """Delete exactly ``scope``; whether it was stored."""
        return await self._run(self._write, _resume, scope)

    async def suspensions(self) -> list[SuspensionScope]:
        """The stored suspensions, sorted by (task type, app id)."""
        return await self._run(self._read, _suspensions, None)

    async def read_events(
        self, after: int | None, *, limit: int = 1000
    ) -> tuple[list[TaskEvent], int]:
        """Up to ``limit`` events after cursor ``after`` in seq (commit) order, each
        with its task's current snapshot, from one ``SELECT``; ``after`` None returns the
        cursor of the last event committed. Events whose task was deleted are skipped,
        and the returned cursor moves past them too."""
        return await self._run(self._read, _read_events, (after, limit))

    async def prune_events(self, older_than: timedelta) -> int:
        """Delete the events recorded more than ``older_than`` ago; how many."""
        return await self._run(self._write, _prune_events, older_than)

    # -- handler registrations (registrations.py) -------------------------------------

    async def put_handler_registration(
        self, registration: HandlerRegistration
    ) -> HandlerRegistration:
        """Insert or replace the registration of its (app id, task type)."""
        return await self._run(self._write, registrations.put_registration, registration)

    async def delete_handler_registration(self, app_id: str | None, task_type: str) -> bool:
        """Delete one registration; whether it existed."""
        key = (app_id, task_type)
        return await self._run(self._write, registrations.delete_registration, key)

    async def handler_registrations(self) -> list[HandlerRegistration]:
        """Every registration, the host's first, then by app id and task type."""
        return await self._run(self._read, registrations.registrations, None)


# -- operations (run on the database thread, inside _write or _read) --------------------


def _enqueue(conn: sqlite3.Connection, tasks: Sequence[NewTask]) -> list[Task]:
    now = _now_us()
    now_dt = _dt(now)
    leaders: dict[tuple[str | None, str, str], str] = {}
    rows: list[Row] = []
    stored: list[Task] = []
    pending = TaskStatus.PENDING
    for new in tasks:
        alias_of: str | None = None
        key = new.dedupe_key
        if key is not None:
            scope = (new.app_id, new.task_type, key)
            alias_of = leaders.get(scope)
            if alias_of is None:
                app_key: str | bytes = b"" if new.app_id is None else new.app_id
                found = conn.execute(_FIND_LEADER, (app_key, new.task_type, key)).fetchone()
                if found is None:
                    leaders[scope] = new.id
                else:
                    alias_of = leaders[scope] = found[0]
        if new.run_at is None:
            run_at, run_at_dt = now, now_dt
        else:
            run_at = _us(new.run_at)
            run_at_dt = _dt(run_at)
        priority = int(new.priority)
        rows.append(
            (
                new.id, new.task_type, now, run_at, now, new.app_id, new.params_json,
                priority, new.max_retries, key, alias_of, new.parent_id, new.user_id,
            )
        )  # fmt: skip
        stored.append(
            Task(
                id=new.id,
                task_type=new.task_type,
                status=pending,
                created_at=now_dt,
                run_at=run_at_dt,
                updated_at=now_dt,
                app_id=new.app_id,
                params=loads(new.params_json),
                priority=priority,
                max_retries=new.max_retries,
                dedupe_key=key,
                alias_of=alias_of,
                parent_id=new.parent_id,
                user_id=new.user_id,
            )
        )
    last = conn.execute(_LAST_TASK_SEQ).fetchone()[0]
    conn.executemany(_INSERT, rows)
    conn.execute(_ENQUEUE_EVENTS, (now, last))
    return stored


def _claim(conn: sqlite3.Connection, request: ClaimRequest) -> list[Task]:
    now = _now_us()
    scopes = conn.execute(_SUSPENSIONS).fetchall()
    suspended = [SuspensionScope(task_type=t, app_id=a) for t, a in scopes]
    statement = claim_statement(request, now, suspended)
    if statement is None:
        return []
    sql, params = statement
    rows = conn.execute(sql, params).fetchall()
    if not rows:
        return []
    claimed = _sorted_tasks(rows)  # also puts rows in claim order
    _insert_events(conn, [(r[_SEQ], r[_ID], "started", "running", now) for r in rows])
    return claimed


def _settle_aliases(
    conn: sqlite3.Connection, leader: Row, now: int, events: list[Row]
) -> list[Row]:
    """Give a terminal leader's aliases its status, result, error and cancel reason;
    append their events (the leader's terminal kind) to ``events``.

    :returns: the aliases' new rows, in creation order.
    """
    status = leader[_STATUS_COL]
    rows = conn.execute(
        _SETTLE_ALIASES,
        (
            status, leader[_RESULT], leader[_ERROR], leader[_CANCEL_REASON],
            now, now, leader[_ID],
        ),
    ).fetchall()  # fmt: skip
    if rows:
        rows.sort(key=lambda r: r[_SEQ])
        kind = _TERMINAL_EVENT[status]
        events += [(r[_SEQ], r[_ID], kind, status, now) for r in rows]
    return rows


def _finish_values(finish: Finish, now: int) -> Row:
    """The VALUES row of one finish (see _FINISH_SETS)."""
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
        reason = (finish.cancel_reason or CancelReason.USER).value
    return (
        lease.task_id, lease.worker_id, lease.attempt, finish.result_json, run_at,
        finish.error, reason, data, has_progress, done, total, message,
    )  # fmt: skip


def _apply_finishes(
    conn: sqlite3.Connection, now: int, kind: FinishKind, values: list[Row]
) -> dict[str, Row]:
    """Run the batched statement of ``kind``; the returned rows by task id."""
    out: dict[str, Row] = {}
    for start in range(0, len(values), _FINISH_CHUNK):
        chunk = values[start : start + _FINISH_CHUNK]
        size = _bucket(len(chunk))
        params: list[Any] = [now]
        for row in chunk:
            params += row
        for _ in range(size - len(chunk)):
            params += _FINISH_PAD
        for row in conn.execute(_finish_sql(kind, size), params):
            out[row[_ID]] = row
    return out


def _finish(conn: sqlite3.Connection, finishes: Sequence[Finish]) -> list[Task | None]:
    now = _now_us()
    results: list[Task | None] = [None] * len(finishes)
    log: list[Row] = []
    events: list[Row] = []
    # Rounds of finishes with distinct task ids, so that a task named twice in one call
    # is finished in call order (the second finds its lease gone, as if sequential).
    rounds: list[list[int]] = []
    seen: dict[str, int] = {}
    for index, finish in enumerate(finishes):
        n = seen.get(finish.lease.task_id, 0)
        seen[finish.lease.task_id] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(index)
    interrupted = AttemptOutcome.INTERRUPTED.value
    for indexes in rounds:
        by_kind: dict[FinishKind, list[int]] = {}
        for index in indexes:
            by_kind.setdefault(finishes[index].kind, []).append(index)
        values = {index: _finish_values(finishes[index], now) for index in indexes}
        # index -> (new row, attempt outcome, event kind)
        applied: dict[int, tuple[Row, str, str]] = {}
        released: list[int] = []
        for kind, members in by_kind.items():
            rows = _apply_finishes(conn, now, kind, [values[i] for i in members])
            event = _FINISH_EVENT[kind]
            for index in members:
                finish = finishes[index]
                row = rows.get(finish.lease.task_id)
                if row is not None:
                    outcome = interrupted if kind is FinishKind.RELEASE else finish.outcome.value
                    applied[index] = (row, outcome, event)
                elif kind is FinishKind.RETRY or kind is FinishKind.FAIL:
                    released.append(index)
        if released:
            # Still held, but a cancel (suspension, shutdown) was requested: release.
            rows = _apply_finishes(conn, now, FinishKind.RELEASE, [values[i] for i in released])
            for index in released:
                row = rows.get(finishes[index].lease.task_id)
                if row is not None:
                    applied[index] = (row, interrupted, _REQUEUED)
        for index in indexes:
            if index not in applied:
                continue
            row, outcome, event = applied[index]
            events.append((row[_SEQ], row[_ID], event, row[_STATUS_COL], now))
            if row[_DEDUPE_KEY] is not None and row[_STATUS_COL] in _TERMINAL_VALUES:
                _settle_aliases(conn, row, now, events)
            finish = finishes[index]
            lease = finish.lease
            log.append(
                (
                    row[_SEQ], lease.task_id, lease.attempt, lease.worker_id,
                    _us(finish.started_at), _us(finish.finished_at), outcome,
                    None if outcome == "completed" else finish.error,
                )
            )  # fmt: skip
            results[index] = _task(row)
    if log:
        conn.executemany(_INSERT_ATTEMPT, log)
        _insert_events(conn, events)
    return results


def _renew(
    conn: sqlite3.Connection, args: tuple[Sequence[Lease], float]
) -> dict[str, CancelReason | None]:
    leases, lease_seconds = args
    until = _now_us() + round(lease_seconds * 1e6)
    held: dict[str, CancelReason | None] = {}
    for lease in leases:
        row = conn.execute(_RENEW, (until, lease.task_id, lease.worker_id, lease.attempt))
        found = row.fetchone()
        if found is not None:
            held[found[0]] = None if found[1] is None else _REASON[found[1]]
    return held


def _save_progress(conn: sqlite3.Connection, updates: Sequence[ProgressUpdate]) -> set[str]:
    now = _now_us()
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
        sql = _PROGRESS_SQL[progress is not None, update.data is not None]
        found = conn.execute(sql, params).fetchone()
        if found is not None:
            written.add(lease.task_id)
            events.append((found[0], lease.task_id, "progress", "running", now))
    if events:
        _insert_events(conn, events)
    return written


def _rescue(conn: sqlite3.Connection, limit: int) -> list[Task]:
    now = _now_us()
    expired = conn.execute(_RESCUE_SELECT, (now, limit)).fetchall()
    rescued: list[Task] = []
    log: list[Row] = []
    events: list[Row] = []
    lost = AttemptOutcome.LOST.value
    for seq, task_id, worker_id, attempts, max_retries, started_at, reason in expired:
        if reason is not None and _REASON[reason].terminal:
            row = conn.execute(_RESCUE_CANCELLED, (now, now, task_id)).fetchone()
        elif reason is not None:
            row = conn.execute(_RESCUE_RELEASED, (now, now, task_id)).fetchone()
        elif attempts < max_retries + 1:
            row = conn.execute(_RESCUE_REQUEUED, (now, now, "lease expired", task_id)).fetchone()
        else:
            row = conn.execute(_RESCUE_FAILED, (now, now, "lease expired", task_id)).fetchone()
        status = row[_STATUS_COL]
        events.append((seq, task_id, _TERMINAL_EVENT.get(status, _REQUEUED), status, now))
        if row[_DEDUPE_KEY] is not None and status in _TERMINAL_VALUES:
            _settle_aliases(conn, row, now, events)
        log.append(
            (
                seq, task_id, attempts, worker_id or "",
                now if started_at is None else started_at, now, lost, "lease expired",
            )
        )  # fmt: skip
        rescued.append(_task(row))
    if log:
        conn.executemany(_INSERT_ATTEMPT, log)
        _insert_events(conn, events)
    return rescued


def _redrive(conn: sqlite3.Connection, task_id: str) -> Task:
    found = conn.execute(
        "SELECT status, alias_of, app_id, task_type, dedupe_key FROM tasks WHERE id = ?",
        (task_id,),
    ).fetchone()
    if found is None:
        raise TaskNotFound(f"no task {task_id}")
    status, alias_of, app_id, task_type, dedupe_key = found
    if status not in ("failed", "cancelled"):
        raise InvalidTransition(
            f"task {task_id} is {status}; only failed or cancelled tasks can be retried"
        )
    if alias_of is not None:
        raise InvalidTransition(f"task {task_id} is an alias of {alias_of}; retry the leader")
    if dedupe_key is not None:
        app_key: str | bytes = b"" if app_id is None else app_id
        leader = conn.execute(_FIND_LEADER, (app_key, task_type, dedupe_key)).fetchone()
        if leader is not None:
            raise InvalidTransition(
                f"task {task_id} cannot be retried: task {leader[0]} is already active "
                f"for dedupe key {dedupe_key!r}"
            )
    now = _now_us()
    row = conn.execute(_REDRIVE, (now, now, task_id)).fetchone()
    conn.execute(_INSERT_EVENT, (row[_SEQ], task_id, _REQUEUED, "pending", now))
    return _task(row)


def _get(conn: sqlite3.Connection, task_id: str) -> Task | None:
    row = conn.execute(_SELECT_TASK, (task_id,)).fetchone()
    return None if row is None else _task(row)


def _query(conn: sqlite3.Connection, args: tuple[TaskFilter, int, int, bool]) -> list[Task]:
    filter, limit, offset, newest_first = args
    where, params = _filter_sql(filter)
    order = "DESC" if newest_first else "ASC"
    sql = f"SELECT {TASK_COLUMNS} FROM tasks{where} ORDER BY seq {order} LIMIT ? OFFSET ?"
    return [_task(r) for r in conn.execute(sql, [*params, limit, offset])]


def _summary(conn: sqlite3.Connection, filter: TaskFilter) -> ProgressSummary:
    where, params = _filter_sql(filter)
    counts = dict(
        conn.execute(f"SELECT status, count(*) FROM tasks{where} GROUP BY status", params)
    )
    pending, running = counts.get("pending", 0), counts.get("running", 0)
    completed, failed = counts.get("completed", 0), counts.get("failed", 0)
    cancelled = counts.get("cancelled", 0)
    return ProgressSummary(
        total=pending + running + completed + failed + cancelled,
        pending=pending,
        running=running,
        completed=completed,
        failed=failed,
        cancelled=cancelled,
    )


def _attempts(conn: sqlite3.Connection, task_id: str) -> list[Attempt]:
    return [
        Attempt(
            task_id=r[0],
            number=r[1],
            worker_id=r[2],
            started_at=_dt(r[3]),
            finished_at=_dt(r[4]),
            outcome=_OUTCOME[r[5]],
            error=r[6],
        )
        for r in conn.execute(_ATTEMPTS, (task_id,))
    ]


_NOT_SUSPENDED: Final = (
    " AND NOT EXISTS (SELECT 1 FROM suspensions s"
    " WHERE (s.task_type IS NULL OR s.task_type = tasks.task_type)"
    " AND (s.app_id IS NULL OR s.app_id IS tasks.app_id))"
)
_NEXT_HOST: Final = (
    f"SELECT min(run_at) FROM tasks WHERE {_CLAIMABLE} AND task_type = ?{_NOT_SUSPENDED}"
)
_NEXT_APP: Final = f"{_NEXT_HOST} AND app_id = ?"


def _next_run_at(conn: sqlite3.Connection, handlers: Sequence[HandlerKey]) -> datetime | None:
    best: int | None = None
    host_types = {t for a, t in handlers if a is None}
    for app_id, task_type in set(handlers):
        if app_id is None:
            row = conn.execute(_NEXT_HOST, (task_type,)).fetchone()
        elif task_type in host_types:
            continue  # the host key already covers every app's tasks of this type
        else:
            row = conn.execute(_NEXT_APP, (task_type, app_id)).fetchone()
        value = row[0]
        if value is not None and (best is None or value < best):
            best = value
    return None if best is None else _dt(best)


def _cleanup(conn: sqlite3.Connection, args: tuple[timedelta, frozenset[TaskStatus]]) -> int:
    older_than, statuses = args
    cutoff = _now_us() - older_than // _ONE_US
    marks = ", ".join("?" * len(statuses))
    where = f"finished_at < ? AND status IN ({marks})"
    params = [cutoff, *(s.value for s in statuses)]
    conn.execute(
        f"DELETE FROM attempts WHERE task_seq IN (SELECT seq FROM tasks WHERE {where})", params
    )
    return conn.execute(f"DELETE FROM tasks WHERE {where}", params).rowcount


def _chunks(items: Sequence[T]) -> list[Sequence[T]]:
    return [items[i : i + _CHUNK] for i in range(0, len(items), _CHUNK)]


def _cancel_targets(
    conn: sqlite3.Connection,
    task_ids: Sequence[str] | None,
    filter: TaskFilter | None,
    cascade: bool,
) -> list[str]:
    """The ids a cancel applies to, in the reference store's order: those named, the
    active tasks ``filter`` selects (in creation order), then breadth first their
    descendants (each task's children in creation order)."""
    order: dict[str, None] = dict.fromkeys(task_ids or ())
    if filter is not None:
        where, params = _filter_sql(filter)
        active = "status IN ('pending', 'running')"
        where = f"{where} AND {active}" if where else f" WHERE {active}"
        selected = conn.execute(f"SELECT id FROM tasks{where} ORDER BY seq", params)
        order.update((row[0], None) for row in selected)
    if cascade:
        # Through every child, finished ones too (their own children may be active);
        # `order` doubles as the visited set, so even a parent_id cycle ends.
        level = list(order)
        while level:
            children: dict[str, list[str]] = {}
            for chunk in _chunks(level):
                sql = (
                    "SELECT id, parent_id FROM tasks "
                    f"WHERE parent_id IN ({_marks(len(chunk))}) ORDER BY seq"
                )
                for child, parent in conn.execute(sql, chunk):
                    children.setdefault(parent, []).append(child)
            found: list[str] = []
            for parent in level:
                for child in children.get(parent, ()):
                    if child not in order:
                        order[child] = None
                        found.append(child)
            level = found
    return list(order)


def _cancel(
    conn: sqlite3.Connection,
    args: tuple[Sequence[str] | None, TaskFilter | None, CancelReason, bool],
) -> list[Task]:
    task_ids, filter, reason, cascade = args
    now = _now_us()
    targets = _cancel_targets(conn, task_ids, filter, cascade)
    rows: dict[str, Row] = {}
    events: list[Row] = []
    changed: list[Row] = []
    if not reason.terminal:
        # SUSPENDED, SHUTDOWN: only a running task without a request yet is asked to stop.
        for chunk in _chunks(targets):
            params = [reason.value, now, *chunk]
            for row in conn.execute(_request_stop_sql(len(chunk)), params):
                rows[row[_ID]] = row
        changed = [rows[i] for i in targets if i in rows]
        events += [(r[_SEQ], r[_ID], "cancel_requested", "running", now) for r in changed]
        if events:
            _insert_events(conn, events)
        return [_task(r) for r in changed]

    # A terminal reason: every selected active task ends CANCELLED, processed as if one
    # by one in `targets` order, but with one UPDATE per 500 tasks.
    position = {task_id: n for n, task_id in enumerate(targets)}
    active: list[Row] = []
    for chunk in _chunks(targets):
        active += conn.execute(
            "SELECT seq, id, status, worker_id, attempts, started_at, alias_of FROM tasks "
            f"WHERE id IN ({_marks(len(chunk))}) AND status IN ('pending', 'running')",
            chunk,
        ).fetchall()
    # An alias whose (active) leader comes before it is cancelled *by* that leader,
    # taking its result and error as aliases always do; otherwise it is cancelled alone.
    first = {r[1]: position[r[1]] for r in active}
    direct = [r[1] for r in active if first.get(r[6], len(targets)) > position[r[1]]]
    for chunk in _chunks(direct):
        for row in conn.execute(_cancel_sql(len(chunk)), [reason.value, now, now, *chunk]):
            rows[row[_ID]] = row
    done: set[str] = set()
    for task_id in targets:
        row = rows.get(task_id)
        if row is None or task_id in done:
            continue
        done.add(task_id)
        changed.append(row)
        events.append((row[_SEQ], task_id, "cancelled", "cancelled", now))
        if row[_DEDUPE_KEY] is not None and row[_ALIAS_OF] is None:
            # Its aliases still PENDING follow it; the dedupe key is free again (the
            # tasks_dedupe_leader index covers active leaders only).
            for alias in _settle_aliases(conn, row, now, events):
                done.add(alias[_ID])
                changed.append(alias)
    error = f"cancelled ({reason.value})"
    cancelled = AttemptOutcome.CANCELLED.value
    log = [
        (
            seq, task_id, attempts, worker_id or "",
            now if started_at is None else started_at, now, cancelled, error,
        )
        for seq, task_id, status, worker_id, attempts, started_at, _ in active
        if status == "running"
    ]  # fmt: skip
    if log:
        conn.executemany(_INSERT_ATTEMPT, log)
    if events:
        _insert_events(conn, events)
    return [_task(r) for r in changed]


def _watch(conn: sqlite3.Connection, leases: Sequence[Lease]) -> dict[str, CancelReason | None]:
    found: dict[str, tuple[str, int, str | None]] = {}
    for chunk in _chunks(leases):
        sql = (
            "SELECT id, worker_id, attempts, cancel_reason FROM tasks "
            f"WHERE id IN ({_marks(len(chunk))}) AND status = 'running'"
        )
        for task_id, worker_id, attempts, reason in conn.execute(sql, [x.task_id for x in chunk]):
            found[task_id] = (worker_id, attempts, reason)
    held: dict[str, CancelReason | None] = {}
    for lease in leases:
        row = found.get(lease.task_id)
        if row is not None and row[0] == lease.worker_id and row[1] == lease.attempt:
            held[lease.task_id] = None if row[2] is None else _REASON[row[2]]
    return held


def _suspend(conn: sqlite3.Connection, scope: SuspensionScope) -> int:
    now = _now_us()
    conn.execute(_SUSPEND, (scope.task_type, scope.app_id, now))
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
        _insert_events(conn, [(seq, i, "cancel_requested", "running", now) for seq, i in asked])
    return len(asked)


def _resume(conn: sqlite3.Connection, scope: SuspensionScope) -> bool:
    return conn.execute(_RESUME, (scope.task_type, scope.app_id)).rowcount > 0


def _suspensions(conn: sqlite3.Connection, _: None) -> list[SuspensionScope]:
    scopes = [SuspensionScope(task_type=t, app_id=a) for t, a in conn.execute(_SUSPENSIONS)]
    scopes.sort(key=lambda s: (s.task_type or "", s.app_id or ""))
    return scopes


def _read_events(
    conn: sqlite3.Connection, args: tuple[int | None, int]
) -> tuple[list[TaskEvent], int]:
    after, limit = args
    if after is None:
        # The last seq ever assigned (AUTOINCREMENT keeps it even when pruned away).
        last = conn.execute(_EVENTS_CURSOR).fetchone()
        return [], 0 if last is None else int(last[0])
    if limit <= 0:
        return [], after
    rows = conn.execute(_READ_EVENTS, (after, limit)).fetchall()
    if not rows:
        return [], after
    snapshots: dict[str, Task] = {}
    events: list[TaskEvent] = []
    start = _EVENT_TASK
    for row in rows:
        task_id = row[start + _ID]
        if task_id is None:
            continue  # the task was deleted since (cleanup): skipped, cursor moves on
        task = snapshots.get(task_id)
        if task is None:
            task = snapshots[task_id] = _task(row[start:])
        events.append(
            TaskEvent(
                kind=_KIND[row[1]],
                task=task,
                status=_STATUS[row[2]],
                at=_dt(row[3]),
                cursor=row[0],
            )
        )
    return events, int(rows[-1][0])


def _prune_events(conn: sqlite3.Connection, older_than: timedelta) -> int:
    cutoff = _now_us() - older_than // _ONE_US
    # `at` is read under the writer lock, so it only grows with seq (unless the wall
    # clock steps back): the events to delete are the prefix of the log before the first
    # young one, found by walking exactly that prefix. After a clock step back this
    # keeps some old events until a later prune; it never deletes a young one.
    first_young = conn.execute(_FIRST_YOUNG_EVENT, (cutoff,)).fetchone()
    if first_young is None:
        return conn.execute("DELETE FROM events WHERE at < ?", (cutoff,)).rowcount
    return conn.execute("DELETE FROM events WHERE seq < ?", (first_young[0],)).rowcount
