"""The SQL of the SQLite backend: every statement, built once at import.

Conventions:

- Parameters are ``?`` placeholders (``?1``... where a statement repeats one).
- The transitions of the lifecycle kernel (:mod:`taskmill.lifecycle`) are generated
  here into ``SET`` lists (:func:`taskmill.sql.lifecycle.set_clause`); no status,
  attempt or event rule is written out by hand.
- Statements whose text depends on a batch's size are cached per size, and sizes are
  rounded (:func:`bucket`) so that only a handful are ever prepared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from taskmill.backends.sqlite.rows import TASK_COLUMNS, as_micros
from taskmill.lifecycle import (
    ALIAS_FIELDS,
    CANCELLATION,
    DEPENDENCY_CANCEL_REASON,
    DEPENDENCY_CANCELLATION,
    FINISHES,
    RELEASED_ON_STOP,
    RESCUE_ERROR,
    RESCUES,
    RescueCase,
    Transition,
)
from taskmill.model import SuspensionScope, TaskFilter
from taskmill.sql.filters import Dialect, SQLFilter, suspended_sql, translate
from taskmill.sql.lifecycle import Sources, assignments, literal, set_clause
from taskmill.sql.rows import ATTEMPT_COLUMN_NAMES, TASK_COLUMN_NAMES, fence_clause
from taskmill.storage import ClaimRequest, FinishKind

__all__ = ["claim_statement", "filter_sql"]

DIALECT: Final = Dialect(
    placeholder=lambda n, sql_type: "?",
    arrays=False,
    timestamp=as_micros,
    false="0",
    true="1",
    contains="instr({column}, {value}) > 0",
)
"""SQLite for :func:`taskmill.sql.filters.translate`."""


def filter_sql(f: TaskFilter) -> SQLFilter:
    """What ``f`` selects, as SQLite (see :attr:`SQLFilter.where`)."""
    return translate(f, DIALECT)


# -- tasks ---------------------------------------------------------------------------

INSERT: Final = (
    "INSERT INTO tasks (id, task_type, status, created_at, run_at, updated_at, app_id, "
    "params, priority, max_retries, dedupe_key, alias_of, parent_id, user_id, waiting_on) "
    "VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
FIND_LEADER: Final = (
    "SELECT id FROM tasks WHERE ifnull(app_id, x'') = ? AND task_type = ? "
    "AND dedupe_key = ? AND alias_of IS NULL AND status IN ('pending', 'running')"
)
SELECT_TASK: Final = f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?"
SELECT_TASKS: Final = f"SELECT {TASK_COLUMNS} FROM tasks"
FENCE: Final = " WHERE " + fence_clause(lambda _: "?")
"""The lease fence (parameters: :meth:`~taskmill.storage.Lease.fence_args`)."""
INSERT_ATTEMPT: Final = (
    "INSERT INTO attempts (task_seq, task_id, number, worker_id, started_at, finished_at, "
    "outcome, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
SETTLE_ALIASES: Final = (
    f"UPDATE tasks SET {', '.join(f'{c} = ?' for c in ALIAS_FIELDS)}, "
    "finished_at = ?, updated_at = ? WHERE alias_of = ? AND status = 'pending' "
    f"RETURNING {TASK_COLUMNS}"
)
"""Settle a terminal leader's aliases (parameters: the leader's
:data:`~taskmill.lifecycle.ALIAS_FIELDS`, now, now, the leader's id)."""
RENEW: Final = f"UPDATE tasks SET lease_expires_at = ?{FENCE} RETURNING id, cancel_reason"
ATTEMPTS: Final = (
    f"SELECT {', '.join(ATTEMPT_COLUMN_NAMES)} "
    "FROM attempts WHERE task_seq = (SELECT seq FROM tasks WHERE id = ?1) "
    "AND task_id = ?1 ORDER BY id"
)
CLAIMABLE: Final = "status = 'pending' AND alias_of IS NULL AND waiting_on = 0"
"""A claimable task: a PENDING leader that waits for no dependency (the claim index's
predicate, plus ``waiting_on = 0``, which only narrows it)."""
LEASE_CLEARED: Final = "worker_id = NULL, lease_expires_at = NULL"

# -- finishing -------------------------------------------------------------------------

# Finishes are applied in batches: one UPDATE ... FROM (VALUES ...) per finish kind,
# joined on the task id and fenced by (RUNNING, worker id, attempt). Each VALUES row is
# (id, worker_id, attempt, result, run_at, error, cancel_reason, data, has_progress,
# done, total, message); ?1 is the store clock.
_FINISH_SOURCES: Final = Sources(
    now="?1", later="v.column5", result="v.column4", error="v.column6", cancel_reason="v.column7"
)
FINISH_SETS: Final = {kind: set_clause(t, _FINISH_SOURCES) for kind, t in FINISHES.items()}
_FINISH_COMMON: Final = f"updated_at = ?1, {LEASE_CLEARED}, data = coalesce(v.column8, tasks.data)"
_FINISH_PROGRESS: Final = (
    "progress_done = CASE WHEN v.column9 THEN v.column10 ELSE tasks.progress_done END, "
    "progress_total = CASE WHEN v.column9 THEN v.column11 ELSE tasks.progress_total END, "
    "progress_message = CASE WHEN v.column9 THEN v.column12 ELSE tasks.progress_message END"
)
"""A terminal finish keeps the attempt's last progress; a requeue resets it instead."""


def _finish_values(t: Transition) -> dict[str, str]:
    """Column → value of every column a finish taking ``t`` writes: what
    :func:`finish_sql` assigns (checked below), for :func:`bury_sql` to select."""
    values = assignments(t, _FINISH_SOURCES)
    values |= {
        "updated_at": "?1",
        "worker_id": "NULL",
        "lease_expires_at": "NULL",
        "data": "coalesce(v.column8, tasks.data)",
    }
    if not t.requeues:
        values |= {
            f"progress_{name}": (
                f"CASE WHEN v.column9 THEN v.column{n} ELSE tasks.progress_{name} END"
            )
            for name, n in (("done", 10), ("total", 11), ("message", 12))
        }
    return values


_FINISH_VALUES: Final = {kind: _finish_values(t) for kind, t in FINISHES.items()}
assert all(
    ", ".join(f"{c} = {e}" for c, e in values.items())
    == f"{FINISH_SETS[kind]}, {_FINISH_COMMON}"
    + ("" if FINISHES[kind].requeues else f", {_FINISH_PROGRESS}")
    for kind, values in _FINISH_VALUES.items()
), "the finish's SET list and the tombstone's values differ"
BURIED: Final = frozenset({FinishKind.COMPLETE, FinishKind.FAIL})
"""The finish kinds whose ``delete`` deletes the task (they end it COMPLETED or
FAILED): :func:`bury_sql` writes their tombstones instead of updating their rows."""
_BURY_SELECTS: Final = {
    kind: ", ".join(_FINISH_VALUES[kind].get(c, f"tasks.{c}") for c in TASK_COLUMN_NAMES)
    for kind in BURIED
}
"""Per kind in :data:`BURIED`, the snapshot columns of a task as its finish leaves it
(:data:`TASK_COLUMN_NAMES` order)."""
FINISH_WIDTH: Final = 12
FINISH_PAD: Final = (None,) * FINISH_WIDTH
FINISH_CHUNK: Final = 128
_finish_sql_cache: dict[tuple[FinishKind, int], str] = {}
_bury_sql_cache: dict[tuple[FinishKind, int], str] = {}


_VALUES_FENCE: Final = {"task_id": "v.column1", "worker_id": "v.column2", "attempt": "v.column3"}
"""The VALUES columns of a finish row that hold its lease's fence arguments."""


def _finish_column(name: str) -> str:
    # `+status`: the unary plus keeps the status test from selecting the partial index
    # tasks_lease (WHERE status = 'running'). With statistics taken while one task was
    # RUNNING, SQLite read every RUNNING task through it and scanned the VALUES once per
    # task (11 ms per finished row with 50,000 RUNNING); rows are found by id instead.
    return f"+tasks.{name}" if name == "status" else f"tasks.{name}"


def finish_sql(kind: FinishKind, rows: int) -> str:
    """The batched finish statement of ``kind`` for ``rows`` VALUES rows."""
    cached = _finish_sql_cache.get((kind, rows))
    if cached is not None:
        return cached
    row = "(" + ", ".join("?" * FINISH_WIDTH) + ")"
    where = fence_clause(_VALUES_FENCE.__getitem__, column=_finish_column)
    if kind in RELEASED_ON_STOP:
        # A task with a stop request is released instead (lifecycle.finish_kind): the
        # RELEASE statement is tried for what this one did not match.
        where += " AND tasks.cancel_reason IS NULL"
    progress = "" if FINISHES[kind].requeues else ", " + _FINISH_PROGRESS
    sql = (
        f"UPDATE tasks SET {FINISH_SETS[kind]}, {_FINISH_COMMON}{progress} "
        f"FROM (VALUES {', '.join([row] * rows)}) AS v WHERE {where} "
        f"RETURNING {TASK_COLUMNS}"
    )
    _finish_sql_cache[(kind, rows)] = sql
    return sql


def bury_sql(kind: FinishKind, rows: int) -> str:
    """The finish of ``kind`` (in :data:`BURIED`) for ``rows`` VALUES rows of finishes
    with ``delete``: instead of :func:`finish_sql`'s ``UPDATE``, the rows as it would
    leave them are written to ``tombstones`` (deleted at ``?1``, the store clock) and
    returned; the task rows, left as they were, are deleted later in the transaction
    (:meth:`~taskmill.backends.sqlite.ledger.SQLiteLedger.forget`). ``OR REPLACE``
    drops an older tombstone of the same id. Same parameters as :func:`finish_sql`."""
    cached = _bury_sql_cache.get((kind, rows))
    if cached is not None:
        return cached
    row = "(" + ", ".join("?" * FINISH_WIDTH) + ")"
    where = fence_clause(_VALUES_FENCE.__getitem__, column=_finish_column)
    if kind in RELEASED_ON_STOP:
        where += " AND tasks.cancel_reason IS NULL"  # as finish_sql
    sql = (
        f"INSERT OR REPLACE INTO tombstones (deleted_at, {TASK_COLUMNS}) "
        f"SELECT ?1, {_BURY_SELECTS[kind]} "
        f"FROM tasks, (VALUES {', '.join([row] * rows)}) AS v WHERE {where} "
        f"RETURNING {TASK_COLUMNS}"
    )
    _bury_sql_cache[(kind, rows)] = sql
    return sql


def bucket(n: int) -> int:
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
    return f"UPDATE tasks SET {sets}{FENCE} RETURNING seq"


PROGRESS_SQL: Final = {(p, d): _progress_sql(p, d) for p in (False, True) for d in (False, True)}

# -- rescue and redrive ------------------------------------------------------------------

RESCUE_SELECT: Final = (
    "SELECT seq, id, worker_id, attempts, max_retries, started_at, cancel_reason FROM tasks "
    "WHERE status = 'running' AND lease_expires_at <= ? ORDER BY lease_expires_at LIMIT ?"
)
_RESCUE_SOURCES: Final = Sources(now="?1", error=literal(RESCUE_ERROR))
RESCUE: Final = {
    case: (
        f"UPDATE tasks SET {set_clause(t, _RESCUE_SOURCES)}, updated_at = ?1, "
        f"{LEASE_CLEARED} WHERE id = ?2 RETURNING {TASK_COLUMNS}"
    )
    for case, t in RESCUES.items()
}
"""The rescue of one expired task in each :class:`~taskmill.lifecycle.RescueCase`
(parameters: now, the task's id)."""
assert set(RESCUE) == set(RescueCase)
REDRIVE: Final = (
    "UPDATE tasks SET status = 'pending', attempts = 0, result = NULL, error = NULL, "
    "cancel_reason = NULL, progress_done = 0, progress_total = NULL, "
    "progress_message = NULL, run_at = ?, updated_at = ?, started_at = NULL, "
    f"finished_at = NULL WHERE id = ? RETURNING {TASK_COLUMNS}"
)
REDRIVE_SELECT: Final = (
    "SELECT status, alias_of, app_id, task_type, dedupe_key FROM tasks WHERE id = ?"
)

# -- claims ------------------------------------------------------------------------------

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
        f"SELECT {columns} FROM tasks WHERE {CLAIMABLE} AND task_type = ?{app} "
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


_NOT_SUSPENDED: Final = " AND NOT " + suspended_sql(
    "suspensions", "tasks.task_type", "tasks.app_id", same="IS"
)
NEXT_HOST: Final = (
    f"SELECT min(run_at) FROM tasks WHERE {CLAIMABLE} AND task_type = ?{_NOT_SUSPENDED}"
)
NEXT_APP: Final = f"{NEXT_HOST} AND app_id = ?"

# -- control and the event log ------------------------------------------------------

# Every write operation appends the events of its changes in its own BEGIN IMMEDIATE
# transaction: a reader never sees a change without its event, and since SQLite
# serialises writers (of every process) the AUTOINCREMENT seq of a later commit is
# always larger than every seq already committed. Cursors therefore increase in commit
# order and no event ever appears behind a cursor a reader already holds.
INSERT_EVENT: Final = (
    "INSERT INTO events (task_seq, task_id, kind, status, at) VALUES (?, ?, ?, ?, ?)"
)
EVENT_WIDTH: Final = 5
EVENT_PAD: Final = (None,) * EVENT_WIDTH
EVENT_CHUNK: Final = 128
_event_sql_cache: dict[int, str] = {}


def events_sql(rows: int) -> str:
    """One INSERT of ``rows`` events from a VALUES list; all-NULL padding rows are
    dropped by the WHERE."""
    cached = _event_sql_cache.get(rows)
    if cached is None:
        row = "(" + ", ".join("?" * EVENT_WIDTH) + ")"
        cached = _event_sql_cache[rows] = (
            "INSERT INTO events (task_seq, task_id, kind, status, at) "
            "SELECT column1, column2, column3, column4, column5 "
            f"FROM (VALUES {', '.join([row] * rows)}) WHERE column1 IS NOT NULL"
        )
    return cached


# The tasks one enqueue inserted are exactly those above the largest seq read before
# inserting (under the writer lock, a new rowid is the largest one plus one).
ENQUEUE_EVENTS: Final = (
    "INSERT INTO events (task_seq, task_id, kind, status, at) "
    "SELECT seq, id, 'enqueued', 'pending', ? FROM tasks WHERE seq > ? ORDER BY seq"
)
LAST_TASK_SEQ: Final = "SELECT ifnull(max(seq), 0) FROM tasks"
EVENTS_CURSOR: Final = "SELECT seq FROM sqlite_sequence WHERE name = 'events'"
READ_EVENTS: Final = (
    f"SELECT e.seq, e.kind, e.status, e.at, {', '.join(f't.{c}' for c in TASK_COLUMN_NAMES)}, "
    f"{', '.join(f'g.{c}' for c in TASK_COLUMN_NAMES)} "
    "FROM events AS e LEFT JOIN tasks AS t ON t.seq = e.task_seq AND t.id = e.task_id "
    "LEFT JOIN tombstones AS g ON t.id IS NULL AND g.id = e.task_id "
    "WHERE e.seq > ? ORDER BY e.seq LIMIT ?"
)
"""The events after a seq, each with its task's columns, then its tombstone's (when a
deleting finish removed the task; else NULLs)."""


def tombstones_sql(rows: int) -> str:
    """Copy the rows of ``rows`` tasks, by seq, into ``tombstones`` (parameters: the
    deletion time, then the seqs); the tombstone of an earlier task of the same id (an
    id enqueued again after its task was deleted) is replaced."""
    return (
        f"INSERT OR REPLACE INTO tombstones (deleted_at, {TASK_COLUMNS}) SELECT ?, {TASK_COLUMNS} "
        f"FROM tasks WHERE seq IN ({marks(rows)})"
    )


TOMBSTONE: Final = f"SELECT {TASK_COLUMNS} FROM tombstones WHERE id = ?"
FIRST_YOUNG_TOMBSTONE: Final = "SELECT n FROM tombstones WHERE deleted_at >= ? ORDER BY n LIMIT 1"
FIRST_YOUNG_EVENT: Final = "SELECT seq FROM events WHERE at >= ? ORDER BY seq LIMIT 1"

SUSPENSIONS: Final = "SELECT task_type, app_id FROM suspensions"
SUSPEND: Final = (
    "INSERT OR IGNORE INTO suspensions (task_type, app_id, created_at) VALUES (?, ?, ?)"
)
RESUME: Final = "DELETE FROM suspensions WHERE task_type IS ? AND app_id IS ?"

CHUNK: Final = 500
"""Most ids bound in one ``IN (...)`` list (SQLite before 3.32 allows 999 variables)."""


def marks(n: int) -> str:
    """``n`` placeholders, comma-separated."""
    return ", ".join("?" * n)


_CANCELLATION_SET: Final = set_clause(CANCELLATION, Sources(now="?2", cancel_reason="?1"))


def cancel_sql(n: int) -> str:
    """Cancel ``n`` active tasks by id (parameters: reason, now, the ids)."""
    return (
        f"UPDATE tasks SET {_CANCELLATION_SET}, updated_at = ?2, {LEASE_CLEARED} "
        f"WHERE id IN ({marks(n)}) AND status IN ('pending', 'running') "
        f"RETURNING {TASK_COLUMNS}"
    )


def request_stop_sql(n: int) -> str:
    """Ask ``n`` running tasks without a request yet to stop (reason, now, the ids)."""
    return (
        "UPDATE tasks SET cancel_reason = ?, updated_at = ? "
        f"WHERE id IN ({marks(n)}) AND status = 'running' AND cancel_reason IS NULL "
        f"RETURNING {TASK_COLUMNS}"
    )


# -- dependencies (docs/dependencies.md) -------------------------------------------------

INSERT_DEPENDENCY: Final = (
    "INSERT OR IGNORE INTO task_dependencies (depends_on, task_id, always) VALUES (?, ?, ?)"
)
COUNT_DOWN: Final = (
    "UPDATE tasks SET waiting_on = waiting_on - 1 WHERE id = ? "
    f"RETURNING {TASK_COLUMNS}, waiting_on"
)
"""One of a dependent's dependencies ended (parameter: the dependent's id); its row, then
the count of dependencies it still waits for."""
_DEPENDENCY_SOURCES: Final = Sources(
    now="?1", error="?2", cancel_reason=literal(DEPENDENCY_CANCEL_REASON.value)
)
DEPENDENCY_CANCEL: Final = (
    f"UPDATE tasks SET {set_clause(DEPENDENCY_CANCELLATION, _DEPENDENCY_SOURCES)}, "
    f"updated_at = ?1, {LEASE_CLEARED} WHERE id = ?3 AND status = 'pending' "
    f"RETURNING {TASK_COLUMNS}"
)
"""A waiting task cancelled by its dependency (parameters: now, the error, its id); no
row when it is no longer PENDING (a blocked alias its leader settled first)."""


def dependencies_sql(n: int) -> str:
    """The status and app of ``n`` named tasks (a dependent's dependencies)."""
    return f"SELECT id, status, app_id FROM tasks WHERE id IN ({marks(n)})"


def resolve_edges_sql(n: int) -> str:
    """Delete (and return) the unresolved edges to ``n`` tasks that just ended."""
    return (
        f"DELETE FROM task_dependencies WHERE depends_on IN ({marks(n)}) "
        "RETURNING depends_on, task_id, always"
    )
