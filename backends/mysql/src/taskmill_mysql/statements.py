"""The SQL of the MySQL backend: every statement, built once at import.

Conventions:

- Parameters are ``%s`` placeholders (aiomysql's format); names are unqualified, since
  every pooled connection uses the taskmill database as its default.
- The transitions of the lifecycle kernel (:mod:`taskmill.lifecycle`) are generated
  here into ``SET`` lists (:func:`taskmill.sql.lifecycle.set_clause`); no status,
  attempt or event rule is written out by hand.
- MySQL has no ``UPDATE ... RETURNING``: an operation locks its rows (``SELECT ... FOR
  UPDATE``, ``SKIP LOCKED`` for claims), updates them by ``seq`` and reads them back
  with :data:`SELECT_BY_SEQ`, all in its one transaction, so what it reads back is
  exactly what it wrote.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from taskmill.lifecycle import (
    ALIAS_FIELDS,
    CANCELLATION,
    DEPENDENCY_CANCEL_REASON,
    DEPENDENCY_CANCELLATION,
    FINISHES,
    RESCUE_ERROR,
    RESCUES,
    Transition,
)
from taskmill.model import TaskFilter
from taskmill.sql.filters import Dialect, SQLFilter, suspended_sql, translate
from taskmill.sql.lifecycle import Sources, assignments, literal, set_clause
from taskmill.sql.rows import ATTEMPT_COLUMN_NAMES, TASK_COLUMN_NAMES, fence_clause
from taskmill.storage import FinishKind

from taskmill_mysql.rows import FENCE_COLUMN_NAMES, TASK_COLUMNS, TASK_JSON, as_stored

__all__ = ["DIALECT", "filter_sql", "marks"]

DIALECT: Final = Dialect(
    placeholder=lambda n, sql_type: "%s",
    arrays=False,
    timestamp=as_stored,
    false="FALSE",
    true="TRUE",
    contains="INSTR({column}, {value}) > 0",
)
"""MySQL for :func:`taskmill.sql.filters.translate`."""


def filter_sql(f: TaskFilter) -> SQLFilter:
    """What ``f`` selects, as MySQL (see :attr:`SQLFilter.where`)."""
    return translate(f, DIALECT)


def marks(n: int) -> str:
    """``n`` placeholders, comma-separated."""
    return ", ".join(["%s"] * n)


def seq_list(seqs: Iterable[int]) -> str:
    """Seqs as SQL integer literals, comma-separated: cheaper than binding each one
    (PyMySQL escapes every argument in Python), and safe, since ``int`` renders only
    digits and a sign."""
    return ", ".join([str(int(q)) for q in seqs])


NOW: Final = "SELECT NOW(6)"
"""The store clock: the server's, in UTC (the session's time zone is +00:00)."""
ACTIVE: Final = "status IN ('pending', 'running')"
LEASE_CLEARED: Final = "worker_id = NULL, lease_expires_at = NULL"

# -- tasks ---------------------------------------------------------------------------

INSERT_PREFIX: Final = (
    "INSERT INTO tasks (id, task_type, status, created_at, run_at, updated_at, app_id, "
    "params, data, priority, max_retries, dedupe_key, alias_of, parent_id, user_id, "
    "waiting_on) VALUES "
)
DEDUPE_HASH: Final = "UNHEX(SHA2(CONCAT(IFNULL(CONCAT('a', %s), 'h'), X'00', %s, X'00', %s), 256))"
"""The ``dedupe_leader`` generated column's expression (0001_initial.sql) over (app
id, task type, dedupe key) arguments: a lookup through the unique index."""
FIND_LEADER: Final = f"SELECT id FROM tasks WHERE dedupe_leader = {DEDUPE_HASH} LOCK IN SHARE MODE"
"""The active leader of a dedupe key, share-locked: a finish of that leader waits for
the enqueue deciding on it to commit, and then settles the alias it made."""
SELECT_TASK: Final = f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = %s"


def select_by_seq(n: int) -> str:
    """The snapshots of ``n`` tasks by seq, in seq order."""
    return f"SELECT {TASK_COLUMNS} FROM tasks WHERE seq IN ({marks(n)}) ORDER BY seq"


def select_tasks_by_id(n: int) -> str:
    """The stored tasks among ``n`` ids (the duplicate-id rule of an enqueue)."""
    return f"SELECT {TASK_COLUMNS} FROM tasks WHERE id IN ({marks(n)})"


INSERTED_SEQS: Final = (
    "SELECT LAST_INSERT_ID(), @@auto_increment_increment, (SELECT seq FROM tasks WHERE id = %s)"
)
"""Right after a multi-row ``INSERT INTO tasks``: the seq of its first row, the step
between seqs, and the seq of its last row (by that row's id). InnoDB reserves the
values of such a "simple insert" (its row count is known) at once and gives them in
row order, so its seqs are first, first + step, ... last; should the last one say
otherwise, the seqs are read by id (:func:`select_seqs_by_id`)."""


def select_seqs_by_id(n: int) -> str:
    return f"SELECT id, seq FROM tasks WHERE id IN ({marks(n)})"


FENCE: Final = fence_clause(lambda _: "%s")
"""The lease fence (parameters: :meth:`~taskmill.storage.Lease.fence_args`)."""
INSERT_ATTEMPTS: Final = (
    "INSERT INTO attempts (task_seq, task_id, number, worker_id, started_at, finished_at, "
    "outcome, error) VALUES "
)
"""An execution-log ``INSERT``, followed by its rendered rows."""
INSERT_ATTEMPT: Final = f"{INSERT_ATTEMPTS}(%s, %s, %s, %s, %s, %s, %s, %s)"
LOCK_ALIASES: Final = (
    "SELECT seq FROM tasks WHERE alias_of = %s AND status = 'pending' ORDER BY seq FOR UPDATE"
)
SETTLE_ALIASES: Final = (
    f"UPDATE tasks SET {', '.join(f'{c} = %s' for c in ALIAS_FIELDS)}, "
    "finished_at = %s, updated_at = %s WHERE alias_of = %s AND status = 'pending'"
)
"""Settle a terminal leader's aliases (parameters: the leader's
:data:`~taskmill.lifecycle.ALIAS_FIELDS`, now, now, the leader's id)."""
ATTEMPTS: Final = (
    f"SELECT {', '.join(ATTEMPT_COLUMN_NAMES)} FROM attempts "
    "WHERE task_seq = (SELECT seq FROM tasks WHERE id = %s) AND task_id = %s ORDER BY id"
)

# -- deleting finished tasks (Finish.delete) -------------------------------------------

BURY: Final = (
    f"REPLACE INTO tombstones ({TASK_COLUMNS}, deleted_at) "
    f"SELECT {TASK_COLUMNS}, %s FROM tasks WHERE seq IN ({{}})"
)
"""Copy some ended tasks' rows (the aliases a deleting finish settled), as the
transaction left them, to ``tombstones`` (formatted with their :func:`seq_list`;
parameter: the store clock); ``REPLACE`` drops an older tombstone of the same id
(0004_tombstones.sql)."""
FORGET_ATTEMPTS: Final = "DELETE FROM attempts WHERE task_seq IN ({})"
FORGET_TASKS: Final = "DELETE FROM tasks WHERE seq IN ({})"
"""Then their execution logs and rows (formatted with the same :func:`seq_list`)."""
SELECT_TOMBSTONE: Final = f"SELECT {TASK_COLUMNS} FROM tombstones WHERE id = %s"
SELECT_TOMBSTONE_BY_SEQ: Final = f"SELECT {TASK_COLUMNS} FROM tombstones WHERE seq = %s"
PRUNE_TOMBSTONES: Final = "DELETE FROM tombstones WHERE deleted_at < %s"

# -- finishing -------------------------------------------------------------------------

LOCK_RUNNING: Final = (
    "SELECT seq, id, worker_id, attempts, cancel_reason FROM tasks WHERE id IN ({}) "
    "AND status = 'running' FOR UPDATE"
)
"""Lock the RUNNING rows among some ids (formatted with their placeholders)."""
LOCK_FINISHING: Final = (
    f"SELECT {TASK_JSON}, NOW(6) FROM tasks WHERE id IN ({{}}) AND status = 'running' FOR UPDATE"
)
"""A finish's first statement: the snapshots of the RUNNING rows among some ids
(formatted with their placeholders; as :data:`~taskmill_mysql.rows.TASK_JSON`),
locked, each followed by the store clock, so that
a finish reads the clock without a round trip of its own (a finish that locks nothing
writes nothing, and needs no clock)."""
LOCK_FINISHING_FENCE: Final = (
    f"SELECT JSON_ARRAY({', '.join(FENCE_COLUMN_NAMES)}), NOW(6) FROM tasks "
    "WHERE id IN ({}) AND status = 'running' FOR UPDATE"
)
""":data:`LOCK_FINISHING` for a finish that builds no snapshots: only the columns it
reads itself (:data:`~taskmill_mysql.rows.FENCE_COLUMN_NAMES`, as one JSON array,
read by :func:`~taskmill_mysql.rows.fence_from_json`), then the store clock."""
FINISH_COLUMNS: Final = (
    "seq", "later", "result", "error", "reason", "data", "has_progress", "done", "total",
    "message",
)  # fmt: skip
"""The columns of one finish's row in the batch ``v`` (see :func:`finish_sql`)."""
_FINISH_SOURCES: Final = Sources(
    now="%s", later="v.later", result="v.result", error="v.error", cancel_reason="v.reason",
    table="t",
)  # fmt: skip
_FINISH_PROGRESS: Final = (
    ", t.progress_done = IF(v.has_progress, v.done, t.progress_done), "
    "t.progress_total = IF(v.has_progress, v.total, t.progress_total), "
    "t.progress_message = IF(v.has_progress, v.message, t.progress_message)"
)
"""A terminal finish keeps the attempt's last progress; a requeue resets it instead."""


def _qualified(assignments: str) -> str:
    """``SET`` assignments with their target columns qualified by ``t.`` (a multi-table
    UPDATE needs it)."""
    return ", ".join(f"t.{a.strip()}" for a in assignments.split(", "))


_FINISH_SETS: Final = {
    kind: (
        f"SET {_qualified(set_clause(t, _FINISH_SOURCES))}, t.updated_at = %s, "
        "t.worker_id = NULL, t.lease_expires_at = NULL, t.data = IFNULL(v.data, t.data)"
        + ("" if t.requeues else _FINISH_PROGRESS)
    )
    for kind, t in FINISHES.items()
}
"""Per finish kind, the ``SET`` list of :func:`finish_sql`, whose only placeholders
are the store clock's (``%s``)."""
assert all(text.count("%") == text.count("%s") for text in _FINISH_SETS.values())


FINISH_ROW_BYTES: Final = 128
"""Bytes of one row of :func:`finish_sql` besides its values (at most: ``UNION ALL
SELECT`` and commas, or the column names of the first row)."""


def finish_bytes(kind: FinishKind, now: str) -> int:
    """Bytes of a :func:`finish_sql` statement of ``kind`` besides its rows."""
    return len(_FINISH_SETS[kind].replace("%s", now)) + 64


def _batch(rows: Sequence[Sequence[str]]) -> str:
    """The batch ``v`` of :func:`finish_sql` and :func:`bury_sql`: a ``UNION ALL`` of
    one ``SELECT`` per finish (its :data:`FINISH_COLUMNS`)."""
    first = ", ".join(
        f"{value} AS {name}" for value, name in zip(rows[0], FINISH_COLUMNS, strict=True)
    )
    more = "".join([" UNION ALL SELECT " + ", ".join(row) for row in rows[1:]])
    return f"(SELECT {first}{more}) AS v"


def finish_sql(kind: FinishKind, rows: Sequence[Sequence[str]], now: str) -> str:
    """The finish of some locked RUNNING tasks as ``kind``: one multi-table ``UPDATE``
    joining the batch ``v`` (a ``UNION ALL`` of one ``SELECT`` per finish) by seq.
    ``rows`` are the finishes' values (:data:`FINISH_COLUMNS`) and ``now`` the store
    clock, all as SQL literals."""
    sets = _FINISH_SETS[kind].replace("%s", now)
    return f"UPDATE tasks AS t JOIN {_batch(rows)} ON t.seq = v.seq {sets}"


def _finish_values(t: Transition) -> dict[str, str]:
    """Column → value of every column a finish taking ``t`` writes: what
    :data:`_FINISH_SETS` assigns (checked below), for :func:`bury_sql` to select."""
    values = assignments(t, _FINISH_SOURCES)
    values |= {
        "updated_at": "%s",
        "worker_id": "NULL",
        "lease_expires_at": "NULL",
        "data": "IFNULL(v.data, t.data)",
    }
    if not t.requeues:
        values |= {
            f"progress_{name}": f"IF(v.has_progress, v.{name}, t.progress_{name})"
            for name in ("done", "total", "message")
        }
    return values


_FINISH_VALUES: Final = {kind: _finish_values(t) for kind, t in FINISHES.items()}
assert all(
    _FINISH_SETS[kind] == "SET " + ", ".join(f"t.{c} = {e}" for c, e in values.items())
    for kind, values in _FINISH_VALUES.items()
), "the finish's SET list and the tombstone's values differ"
BURIED: Final = frozenset({FinishKind.COMPLETE, FinishKind.FAIL})
"""The finish kinds whose ``delete`` deletes the task (they end it COMPLETED or
FAILED)."""
_BURY_SELECTS: Final = {
    kind: ", ".join(_FINISH_VALUES[kind].get(c, f"t.{c}") for c in TASK_COLUMN_NAMES)
    for kind in BURIED
}
"""Per kind in :data:`BURIED`, the snapshot columns of a task as its finish leaves
it (:data:`TASK_COLUMN_NAMES` order; placeholders: the store clock's)."""


def bury_bytes(kind: FinishKind, now: str) -> int:
    """Bytes of a :func:`bury_sql` statement of ``kind`` besides its rows."""
    return len(_BURY_SELECTS[kind].replace("%s", now)) + len(TASK_COLUMNS) + 128


def bury_sql(kind: FinishKind, rows: Sequence[Sequence[str]], now: str) -> str:
    """The finish of some locked RUNNING tasks as ``kind`` (in :data:`BURIED`) by a
    finish with ``delete``: instead of :func:`finish_sql`'s ``UPDATE``, their rows as
    it would leave them are written to ``tombstones`` (deleted at ``now``), joining
    the same batch ``v``; the task rows are deleted later in the transaction
    (:data:`FORGET_TASKS`). ``REPLACE`` drops an older tombstone of the same id."""
    selects = _BURY_SELECTS[kind].replace("%s", now)
    return (
        f"REPLACE INTO tombstones ({TASK_COLUMNS}, deleted_at) SELECT {selects}, {now} "
        f"FROM tasks AS t JOIN {_batch(rows)} ON t.seq = v.seq"
    )


RENEW: Final = "UPDATE tasks SET lease_expires_at = %s WHERE seq IN ({})"


def _progress_sql(with_progress: bool, with_data: bool) -> str:
    sets = "updated_at = %s"
    if with_progress:
        sets += ", progress_done = %s, progress_total = %s, progress_message = %s"
    if with_data:
        sets += ", data = %s"
    return f"UPDATE tasks SET {sets} WHERE seq = %s"


PROGRESS_SQL: Final = {(p, d): _progress_sql(p, d) for p in (False, True) for d in (False, True)}

# -- rescue and redrive ------------------------------------------------------------------

RESCUE_SELECT: Final = (
    "SELECT seq, id, worker_id, attempts, max_retries, started_at, cancel_reason FROM tasks "
    "WHERE status = 'running' AND lease_expires_at <= %s ORDER BY lease_expires_at LIMIT %s "
    "FOR UPDATE SKIP LOCKED"
)
_RESCUE_SOURCES: Final = Sources(now="%(now)s", error=literal(RESCUE_ERROR))
RESCUE: Final = {
    case: (
        f"UPDATE tasks SET {set_clause(t, _RESCUE_SOURCES)}, updated_at = %(now)s, "
        f"{LEASE_CLEARED} WHERE seq = %(seq)s"
    )
    for case, t in RESCUES.items()
}
"""The rescue of one expired, locked task in each
:class:`~taskmill.lifecycle.RescueCase` (named parameters now, seq)."""
REDRIVE: Final = (
    "UPDATE tasks SET status = 'pending', attempts = 0, result = NULL, error = NULL, "
    "cancel_reason = NULL, progress_done = 0, progress_total = NULL, "
    "progress_message = NULL, run_at = %s, updated_at = %s, started_at = NULL, "
    "finished_at = NULL WHERE seq = %s"
)
REDRIVE_SELECT: Final = (
    "SELECT seq, status, alias_of, app_id, task_type, dedupe_key FROM tasks WHERE id = %s "
    "FOR UPDATE"
)

# -- claims ------------------------------------------------------------------------------

CLAIM_UPDATE: Final = (
    "UPDATE tasks SET status = 'running', attempts = attempts + 1, worker_id = %s, "
    "started_at = %s, updated_at = %s, lease_expires_at = %s WHERE seq IN ({})"
)
"""The claim of some locked rows (formatted with their :func:`seq_list`); what it
writes is applied to the rows in Python by :func:`taskmill_mysql.rows.claimed_row`."""


def claim_select(app_key: bool, excluded: int, min_priority: bool) -> str:
    """Pick (and lock, skipping rows other claims hold) one handler key's best due tasks
    through ``tasks_claim``, their whole snapshots (as
    :data:`~taskmill_mysql.rows.TASK_JSON`; the claim's ``UPDATE`` is then
    applied to them in Python, :func:`taskmill_mysql.rows.claimed_row`, instead of
    being read back): parameters task type, [app id | excluded apps], now, [min
    priority], limit."""
    if app_key:
        app = " AND app_id = %s"
    elif excluded:
        app = f" AND (app_id IS NULL OR app_id NOT IN ({marks(excluded)}))"
    else:
        app = ""
    prio = " AND priority >= %s" if min_priority else ""
    return (
        f"SELECT {TASK_JSON} FROM tasks FORCE INDEX (tasks_claim) WHERE claim_type = %s{app} "
        f"AND run_at <= %s{prio} ORDER BY claim_rank, seq LIMIT %s FOR UPDATE SKIP LOCKED"
    )


NEXT_RUN: Final = "SELECT MIN(run_at) FROM tasks WHERE claim_type = %s{app} AND NOT " + (
    suspended_sql("suspensions", "tasks.task_type", "tasks.app_id", same="<=>")
)

# -- control and the event log ------------------------------------------------------

EVENT_CURSOR_DRAW: Final = "UPDATE event_cursor SET value = LAST_INSERT_ID(value + %s) WHERE id = 1"
"""Draw ``n`` event seqs: the row lock is held to the commit (see 0001_initial.sql), and
the last seq drawn is left in the session's ``LAST_INSERT_ID()`` for the events'
``INSERT`` (:data:`EVENT_ROW`) that follows it."""
EVENT_CURSOR: Final = "SELECT value FROM event_cursor WHERE id = 1"
_EVENTS_INTO: Final = "INSERT INTO events (seq, task_seq, task_id, kind, status, at) "
INSERT_EVENTS: Final = f"{_EVENTS_INTO}VALUES "
INSERT_ENQUEUED_EVENTS: Final = (
    f"{_EVENTS_INTO}SELECT LAST_INSERT_ID() - %s + (seq - %s) DIV %s, seq, id, "
    "'enqueued', 'pending', %s FROM tasks WHERE seq BETWEEN %s AND %s"
)
"""The ENQUEUED events of the tasks one multi-row ``INSERT`` stored, copied from their
rows (parameters: how many seqs before the last one drawn the first event's is, the
first task seq, the step between task seqs, at, the first and the last task seq)."""
EVENT_ROW: Final = "(LAST_INSERT_ID() - %s, %s, %s, %s, %s, %s)"
"""One event: how many seqs before the last one drawn (:data:`EVENT_CURSOR_DRAW` in
the same transaction), task seq, task id, kind, status, at."""
READ_EVENTS: Final = (
    "SELECT e.seq, e.kind, e.status, e.at, "
    + ", ".join(f"COALESCE(t.{c}, d.{c})" for c in TASK_COLUMN_NAMES)
    + " FROM events AS e LEFT JOIN tasks AS t ON t.seq = e.task_seq AND t.id = e.task_id "
    "LEFT JOIN tombstones AS d ON d.seq = e.task_seq AND d.id = e.task_id "
    "WHERE e.seq > %s ORDER BY e.seq LIMIT %s"
)
"""Events after a seq, each with its task's snapshot columns: from ``tasks``, or from
``tombstones`` for a task its finish deleted (a seq is in one of the two at a time, so
at most one side of the joins has the row and ``COALESCE`` picks its value, NULL
included), all NULL for a task ``cleanup`` deleted."""
FIRST_YOUNG_EVENT: Final = "SELECT seq FROM events WHERE at >= %s ORDER BY seq LIMIT 1"

SUSPENSIONS: Final = "SELECT task_type, app_id FROM suspensions"
CLAIM_PRELUDE: Final = (
    "SELECT NOW(6), s.created_at, s.task_type, s.app_id FROM claim_gate AS g"
    " LEFT JOIN suspensions AS s"
    " ON TRUE WHERE g.id = 1 LOCK IN SHARE MODE"
)
"""A claim's first statement: the store clock and the stored suspensions (one row per
suspension, or one row whose ``created_at`` is NULL when there is none), read after
share-locking the claim gate (see 0001_initial.sql), in one round trip."""
CLAIM_GATE_EXCLUSIVE: Final = "SELECT id FROM claim_gate WHERE id = 1 FOR UPDATE"
"""Taken by a suspension before it is stored."""
SUSPEND: Final = (
    "INSERT INTO suspensions (task_type, app_id, created_at) VALUES (%s, %s, %s) "
    "ON DUPLICATE KEY UPDATE created_at = created_at"
)
RESUME: Final = "DELETE FROM suspensions WHERE task_type <=> %s AND app_id <=> %s"

CANCELLATION_SET: Final = set_clause(
    CANCELLATION, Sources(now="%(now)s", cancel_reason="%(reason)s")
)

# -- dependencies (docs/dependencies.md) -------------------------------------------------


def lock_dependencies(n: int) -> str:
    """The status and app of ``n`` dependencies, share-locked: a dependency finishing
    meanwhile either committed first (its status is read here) or waits for this
    enqueue, and then finds (with a locking read) the edges written here."""
    return f"SELECT id, status, app_id FROM tasks WHERE id IN ({marks(n)}) LOCK IN SHARE MODE"


def lock_edges(n: int) -> str:
    """The unresolved edges to ``n`` tasks that just ended, locked (a locking read sees
    every committed edge)."""
    return (
        "SELECT depends_on, task_id, always FROM task_dependencies "
        f"WHERE depends_on IN ({marks(n)}) FOR UPDATE"
    )


def delete_edges(n: int) -> str:
    return f"DELETE FROM task_dependencies WHERE depends_on IN ({marks(n)})"


INSERT_DEPENDENCY: Final = (
    "INSERT IGNORE INTO task_dependencies (depends_on, task_id, always) VALUES (%s, %s, %s)"
)
COUNT_DOWN: Final = "UPDATE tasks SET waiting_on = waiting_on - 1 WHERE id = %s"
WAITING_OF: Final = "SELECT seq, status, waiting_on FROM tasks WHERE id = %s"
DEPENDENCY_CANCEL: Final = (
    "UPDATE tasks SET "
    + set_clause(
        DEPENDENCY_CANCELLATION,
        Sources(
            now="%(now)s",
            error="%(error)s",
            cancel_reason=literal(DEPENDENCY_CANCEL_REASON.value),
        ),
    )
    + f", updated_at = %(now)s, {LEASE_CLEARED} WHERE seq = %(seq)s"
)
"""A waiting task cancelled by its dependency (named parameters now, error, seq)."""
