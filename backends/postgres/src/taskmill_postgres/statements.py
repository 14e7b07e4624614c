"""The SQL of the PostgreSQL backend, for one schema: :class:`Statements`.

Conventions every statement here follows:

- Batches travel as arrays (``unnest($1::text[], ...) WITH ORDINALITY``): one statement
  and one round trip per batch, whatever its size.
- Every statement costs the same per row whatever its batch size, whatever the table's
  statistics say: a batch reaches its task rows only through lookups by key (see
  :data:`FENCE`), and CTEs are combined by sorting or hashing, never by a nested loop
  over one of them (see :meth:`Statements._events_of`). ``tests/test_postgres_plans.py``
  checks the plans.
- Operations that can be one statement are one statement (an implicit transaction),
  with data-modifying CTEs: enqueue, claim, finish, progress, rescue and suspension
  each write their task rows, execution-log rows, events and notifications together.
  Cancel and redrive, which decide in Python between statements, are one transaction.
- Events are written last, behind the *events gate*: a CTE that first counts every row
  the statement changed (which makes PostgreSQL finish those changes), then takes the
  schema's events lock (``pg_advisory_xact_lock``) and sends the notifications. The event
  seqs are therefore drawn under the lock, in commit order (see 0001_initial.sql), and
  a statement never waits for a row lock while it holds the events lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import attrs
from taskmill.lifecycle import (
    CANCELLATION,
    DEFAULT_CANCEL_REASON,
    DEPENDENCY_CANCEL_REASON,
    DEPENDENCY_CANCELLATION,
    FINISHES,
    RESCUE_ERROR,
    RESCUES,
    TERMINAL_EVENTS,
    RescueCase,
)
from taskmill.model import TaskFilter, TaskStatus
from taskmill.sql.filters import Dialect, suspended_sql, translate
from taskmill.sql.lifecycle import (
    PROGRESS_COLUMNS,
    Sources,
    event_sql,
    literal,
    outcome_sql,
    rescue_case_sql,
    set_clause,
    stop_release_sql,
    transition_cases,
)
from taskmill.sql.rows import TASK_COLUMN_NAMES, fence_clause
from taskmill.storage import ClaimRequest, FinishKind

from taskmill_postgres.options import quote_ident

__all__ = [
    "DELETED_ON_FINISH",
    "TASK_COLUMNS",
    "TASK_COLUMN_NAMES",
    "TOMBSTONE_COLUMNS",
    "ClaimShape",
    "Statements",
    "filter_sql",
]


def columns(alias: str) -> str:
    """The snapshot columns qualified by ``alias``."""
    return ", ".join(f"{alias}.{c}" for c in TASK_COLUMN_NAMES)


TASK_COLUMNS: Final = ", ".join(TASK_COLUMN_NAMES)
TOMBSTONE_COLUMNS: Final = (*TASK_COLUMN_NAMES, "waiting_on")
"""The columns of a tombstone (0008_tombstones.sql), ``deleted_at`` aside: those of
``tasks``."""
DELETED_ON_FINISH: Final = (TaskStatus.COMPLETED, TaskStatus.FAILED)
"""The statuses in which a finish with ``Finish.delete`` deletes its task."""
CLAIMABLE: Final = "status = 'pending' AND alias_of IS NULL AND waiting_on = 0"
"""The predicate of the partial ``tasks_claim`` index (queries repeat it verbatim)."""
ACTIVE: Final = "status IN ('pending', 'running')"

FENCE: Final = fence_clause(
    {"task_id": "v.id", "worker_id": "v.worker_id", "attempt": "v.attempt"}.__getitem__,
    status="v.running",
    column=lambda name: f"t.{name}",
)
"""A batch row's lease, fenced: task ``t`` is RUNNING, held by the batch row's worker
for the batch row's attempt (``v``, a CTE built by :func:`batch`).

The status is compared with the batch's own constant column ``v.running``, not with the
literal ``'running'``. A literal is a restriction the planner estimates from the
table's statistics, and it matches the predicate of the partial index ``tasks_lease``:
with statistics taken while the tasks were PENDING (right after a bulk enqueue) the
planner believed almost nothing was RUNNING, read every RUNNING task through that index
and looped over the whole batch for each one. A finish of 1,000 rows against 50,000
RUNNING tasks took 56 s that way, one of 10,000 rows ten times longer. Compared with a
column of a materialized CTE, the status is a join condition: no index predicate
follows from it and no statistic estimates it, so the batch reaches its rows by their
unique ``id``, one lookup per batch row (or, for a batch that is a large part of the
table, one hash join)."""


def batch(arrays: str, columns: str) -> str:
    """The CTE ``v`` of a batch: one row per position of ``arrays`` (an ``unnest``
    argument list) named ``columns``, with its position ``ord`` and the constant
    ``running`` that :data:`FENCE` needs. Materialized, so that ``running`` stays a
    column."""
    return (
        f"v AS MATERIALIZED (SELECT u.*, 'running'::text AS running FROM unnest({arrays})"
        f" WITH ORDINALITY AS u({columns}, ord))"
    )


_RELEASED_KIND: Final = stop_release_sql("v.kind", "t.cancel_reason")
"""A finish's effective kind: a RETRY or FAIL of a task asked to stop (suspension,
shutdown) is a RELEASE. Evaluated against the row before the update."""


def notify(channel: int, kind: str) -> str:
    """SQL sending a notification of ``kind`` (a StoreChange value) on the channel
    whose prefix is argument ``$channel``."""
    return f"pg_notify(${channel} || '{kind}', '')"


def gate(changed: str, lock: int, notifies: Sequence[str], also: str | None = None) -> str:
    """The events-gate CTE (named ``gate``): after counting the rows of the CTE
    ``changed`` (and of ``also``), so that every change is made first, take the events
    lock ``$lock`` and evaluate ``notifies`` (SQL expressions, see :func:`notify`). It
    yields one row when ``changed`` has any, else none (no lock, no notification)."""
    more = f" CROSS JOIN (SELECT count(*) AS n FROM {also}) AS a" if also else ""
    sent = "".join(f", {n} AS n{i}" for i, n in enumerate(notifies))
    return (
        f"gate AS MATERIALIZED (SELECT pg_advisory_xact_lock(${lock}) AS l{sent} "
        f"FROM (SELECT count(*) AS n FROM {changed}) AS c{more} WHERE c.n > 0)"
    )


_FINISH_EVENT: Final = event_sql(FINISHES.values(), status="d.status", released="d.released")
"""The event kind of a finish: by the new status, and whether the attempt was given back
(a release)."""

_FINISH_COLUMNS: Final = (
    "status", "attempts", "run_at", "finished_at", "result", "error", "cancel_reason",
    *PROGRESS_COLUMNS,
)  # fmt: skip
_FINISH_SOURCES: Final = Sources(
    now="now()",
    later="now() + v.retry_in * interval '1 second'",
    result="v.result::json",
    error="v.error",
    cancel_reason=f"coalesce(v.reason, {literal(DEFAULT_CANCEL_REASON.value)})",
    table="t",
)
_FINISH_KEPT: Final = {
    **{c: f"t.{c}" for c in _FINISH_COLUMNS},
    # A terminal finish keeps the attempt's last progress (a requeue resets it).
    "progress_done": "CASE WHEN v.has_progress THEN v.done ELSE t.progress_done END",
    "progress_total": "CASE WHEN v.has_progress THEN v.total ELSE t.progress_total END",
    "progress_message": "CASE WHEN v.has_progress THEN v.message ELSE t.progress_message END",
}
_FINISH_SETS: Final = transition_cases(
    _RELEASED_KIND,
    FINISHES,
    {kind: kind.value for kind in FINISHES},
    dict.fromkeys(FINISHES, _FINISH_SOURCES),
    _FINISH_KEPT,
    _FINISH_COLUMNS,
)
"""The SET list of the finish statement, every kind's transition in one CASE per
column (see :mod:`taskmill.sql.lifecycle`)."""
_FINISH_SET_LIST: Final = ", ".join(f"{c} = {e}" for c, e in _FINISH_SETS.items())
_FINISH_ARRAYS: Final = (
    "$1::text[], $2::text[], $3::integer[], $4::text[], $5::text[], $6::float8[],"
    " $7::text[], $8::text[], $9::text[], $10::boolean[], $11::float8[], $12::float8[],"
    " $13::text[], $14::text[], $15::timestamptz[], $16::timestamptz[]"
)
"""The 16 arrays of a finish batch (see :func:`taskmill_postgres.arguments.finish_arrays`)."""
_FINISH_BATCH_COLUMNS: Final = (
    "id, worker_id, attempt, kind, result, retry_in, error, reason, data, has_progress,"
    " done, total, message, outcome, started_at, finished_at"
)
_COMPLETE_SETS: Final = transition_cases(
    literal(FinishKind.COMPLETE.value),
    {FinishKind.COMPLETE: FINISHES[FinishKind.COMPLETE]},
    {FinishKind.COMPLETE: FinishKind.COMPLETE.value},
    {FinishKind.COMPLETE: _FINISH_SOURCES},
    _FINISH_KEPT,
    _FINISH_COLUMNS,
)
"""The columns a COMPLETE writes (one constant CASE each, which the planner folds): the
row a deleting COMPLETE deletes instead of writing, as its tombstone."""

_RESCUE_COLUMNS: Final = (
    "status", "attempts", "run_at", "error", "cancel_reason", "finished_at", *PROGRESS_COLUMNS,
)  # fmt: skip
_RESCUE_SETS: Final = transition_cases(
    rescue_case_sql("e.cancel_reason", "t.attempts", "t.max_retries"),
    RESCUES,
    {case: case.value for case in RescueCase},
    dict.fromkeys(RESCUES, Sources(now="now()", error=literal(RESCUE_ERROR), table="t")),
    {c: f"t.{c}" for c in _RESCUE_COLUMNS},
    _RESCUE_COLUMNS,
)
"""The SET list of the rescue statement (``e``: the expired rows as locked)."""
_RESCUE_EVENT: Final = event_sql(RESCUES.values(), status="r.status", released=None)
_LOST: Final = literal(next(iter({str(t.outcome.value) for t in RESCUES.values() if t.outcome})))
"""The outcome every rescue logs."""
assert CANCELLATION.outcome is not None
_CANCELLED_OUTCOME: Final = CANCELLATION.outcome.value
_TERMINAL: Final = ", ".join(literal(s.value) for s in TERMINAL_EVENTS)
"""The terminal statuses, in which a dedupe leader settles its aliases."""
_CANCELLATION_SET: Final = set_clause(CANCELLATION, Sources(now="now()", cancel_reason="$1"))
_DEPENDENCY_CANCEL_SET: Final = set_clause(
    DEPENDENCY_CANCELLATION,
    Sources(now="now()", error="$2", cancel_reason=literal(DEPENDENCY_CANCEL_REASON.value)),
)


_ENQUEUE_INPUT: Final = (
    " SELECT i.id, i.task_type, i.app_id, i.params, i.priority::bigint AS priority,"
    " i.max_retries::integer AS max_retries, i.run_at::timestamptz AS run_at,"
    " i.dedupe_key, i.parent_id, i.user_id, i.waiting_on::integer AS waiting_on, i.ord"
    " FROM ROWS FROM (json_array_elements_text($1::json),"
    " json_array_elements_text($2::json), json_array_elements_text($3::json),"
    " json_array_elements($4::json), json_array_elements_text($5::json),"
    " json_array_elements_text($6::json), json_array_elements_text($7::json),"
    " json_array_elements_text($8::json), json_array_elements_text($9::json),"
    " json_array_elements_text($10::json), json_array_elements_text($13::json))"
    " WITH ORDINALITY AS i(id, task_type, app_id, params, priority, max_retries,"
    " run_at, dedupe_key, parent_id, user_id, waiting_on, ord)"
)
"""The rows of an enqueue batch, in the order given (``ord``).

The batch travels as JSON arrays, one per column ($4: the params objects themselves),
read side by side (a column sent as NULL reads as NULLs). asyncpg would encode Python
lists as PostgreSQL arrays element by element, checking each element for being a
nested array: that cost more client time than the rest of the call's transport
(docs/backends/postgresql.md, "Bulk enqueue")."""


def _enqueue_statement(s: str, *, keyed: bool) -> str:
    """The enqueue statement of schema ``s``: insert the batch (arguments: ten JSON
    arrays, see :data:`_ENQUEUE_INPUT`, the events lock $11, the channel prefix $12 and
    the dependency counts $13), append an ENQUEUED event per task behind the gate and
    notify ``work`` and ``events``; one row: ``now()`` and the ids and leaders of the
    aliases.

    ``keyed``: some task has a dedupe key. Each keyed task becomes an alias of its
    scope's active leader (share-locked while deciding), else of the first task of its
    scope in this call, else it leads. Without keys the batch is inserted straight from
    the arguments, without the joins that decide aliases."""
    alias_of = "NULL"
    source = "input AS i"
    ctes = f"WITH input AS ({_ENQUEUE_INPUT}),"
    if keyed:
        alias_of = (
            "CASE WHEN k.ord IS NULL THEN NULL ELSE coalesce(h.leader_id,"
            " CASE WHEN k.ord = h.head_ord THEN NULL ELSE h.head_id END) END"
        )
        source = (
            "input AS i LEFT JOIN keyed AS k ON k.ord = i.ord"
            " LEFT JOIN heads AS h ON h.head_ord = k.head_ord"
        )
        ctes = (
            f"WITH input AS MATERIALIZED ({_ENQUEUE_INPUT}),"
            # The first task of each dedupe scope in this call...
            " keyed AS MATERIALIZED ("
            " SELECT i.ord, i.app_id, i.task_type, i.dedupe_key,"
            " first_value(i.id) OVER w AS head_id, first_value(i.ord) OVER w AS head_ord"
            " FROM input AS i WHERE i.dedupe_key IS NOT NULL"
            " WINDOW w AS (PARTITION BY i.app_id, i.task_type, i.dedupe_key ORDER BY i.ord)),"
            # ... and the scope's active leader, share-locked: a leader finishing
            # concurrently either commits first (and is no longer found) or waits for
            # this enqueue, and then settles the alias written here (see _settle_aliases).
            " heads AS MATERIALIZED ("
            " SELECT h.head_ord, h.head_id, l.id AS leader_id FROM"
            " (SELECT DISTINCT head_ord, head_id, app_id, task_type, dedupe_key FROM keyed) AS h"
            f" LEFT JOIN LATERAL (SELECT t.id FROM {s}.tasks AS t"
            " WHERE coalesce(t.app_id, '') = coalesce(h.app_id, '')"
            " AND (t.app_id IS NULL) = (h.app_id IS NULL)"
            " AND t.task_type = h.task_type AND t.dedupe_key = h.dedupe_key"
            f" AND t.dedupe_key IS NOT NULL AND t.alias_of IS NULL AND t.{ACTIVE}"
            " FOR SHARE OF t) AS l ON true),"
        )
    return (
        f"{ctes} ins AS (INSERT INTO {s}.tasks (id, task_type, status, created_at, run_at,"
        " updated_at, app_id, params, priority, max_retries, dedupe_key, alias_of,"
        " parent_id, user_id, waiting_on)"
        " SELECT i.id, i.task_type, 'pending', now(), coalesce(i.run_at, now()), now(),"
        f" i.app_id, i.params, i.priority, i.max_retries, i.dedupe_key, {alias_of},"
        " i.parent_id, i.user_id, coalesce(i.waiting_on, 0)"
        f" FROM {source} ORDER BY i.ord RETURNING seq, id, alias_of),"
        f" {gate('ins', 11, [notify(12, 'work'), notify(12, 'events')])},"
        f" ev AS (INSERT INTO {s}.events (task_seq, kind, status, at)"
        " SELECT ins.seq, 'enqueued', 'pending', now() FROM gate, ins ORDER BY ins.seq)"
        " SELECT now() AS now,"
        " array_agg(id) FILTER (WHERE alias_of IS NOT NULL) AS alias_ids,"
        " array_agg(alias_of) FILTER (WHERE alias_of IS NOT NULL) AS leader_ids"
        " FROM ins"
    )


@attrs.frozen
class ClaimShape:
    """The form of one claim statement (its SQL depends only on this)."""

    branches: tuple[tuple[bool, bool], ...]
    """Per handler key: (app-specific key?, excludes some apps?)."""
    min_priority: bool


class Statements:
    """Every SQL statement of the backend for ``schema`` (quoted and qualified)."""

    def __init__(self, schema: str) -> None:
        s = quote_ident(schema)
        self.schema = schema
        self.quoted = s
        self._claim_cache: dict[ClaimShape, str] = {}

        self.insert_events = (
            "WITH gate AS MATERIALIZED (SELECT pg_advisory_xact_lock($1) AS l, "
            f"{notify(2, 'events')} AS n, "
            "(SELECT count(*) FROM (SELECT pg_notify($2 || k, '')"
            " FROM unnest($3::text[]) AS k) AS x) AS m) "
            f"INSERT INTO {s}.events (task_seq, kind, status, at) "
            "SELECT e.task_seq, e.kind, e.status, now() "
            "FROM gate, unnest($4::bigint[], $5::text[], $6::text[]) "
            "WITH ORDINALITY AS e(task_seq, kind, status, ord) ORDER BY e.ord"
        )
        """Append events (lock, channel, other kinds to notify, then the task seq, kind
        and status arrays) in order, behind the gate; the last statement of a
        multi-statement transaction."""

        # -- enqueue ------------------------------------------------------------------------
        self.enqueue = _enqueue_statement(s, keyed=True)
        """Insert a batch of which some task has a dedupe key: see :func:`_enqueue_statement`."""
        self.enqueue_unkeyed = _enqueue_statement(s, keyed=False)
        """Insert a batch without dedupe keys (no alias to decide, no leader to lock)."""

        # -- finishing ------------------------------------------------------------------------
        logged = outcome_sql(FINISHES.values(), released="d.released", reported="d.outcome")
        requeued = f"(SELECT {notify(18, 'work')} FROM done WHERE status = 'pending' LIMIT 1)"
        finish_batch = batch(_FINISH_ARRAYS, _FINISH_BATCH_COLUMNS)
        events = self._events_of(f"SELECT d.seq, {_FINISH_EVENT}, d.status, d.ord FROM done AS d")

        def finish_statement(returning: str, result: str) -> str:
            return (
                f"WITH {finish_batch},"
                f" done AS (UPDATE {s}.tasks AS t SET {_FINISH_SET_LIST},"
                " updated_at = now(), worker_id = NULL, lease_expires_at = NULL,"
                " data = coalesce(v.data::json, t.data)"
                f" FROM v WHERE {FENCE}"
                f" RETURNING {returning}, v.ord, t.attempts < v.attempt AS released,"
                " v.attempt, v.worker_id AS lease_worker, v.started_at AS attempt_started,"
                " v.finished_at AS attempt_finished, v.outcome, v.error AS attempt_error),"
                f" log AS (INSERT INTO {s}.attempts (task_seq, number, worker_id, started_at,"
                " finished_at, outcome, error)"
                " SELECT d.seq, d.attempt, d.lease_worker, d.attempt_started, d.attempt_finished,"
                " o.outcome, CASE WHEN o.outcome = 'completed' THEN NULL ELSE d.attempt_error END"
                f" FROM done AS d CROSS JOIN LATERAL (SELECT {logged} AS outcome) AS o"
                " ORDER BY d.ord),"
                f" {self._aliases_of('done')},"
                f" {self._dependents_of('done', 17, 18)},"
                f" {gate('done', 17, [notify(18, 'events'), requeued], also='al')},"
                f" {events}"
                # dp is run by being read, once (an InitPlan), before done's rows are returned.
                f" SELECT {result} FROM done WHERE (SELECT count(*) FROM dp) >= 0"
            )

        self.finish = finish_statement(columns("t"), "*")
        """Finish a batch (16 arrays, then the events lock and the channel prefix): every kind
        in one UPDATE, the execution-log rows, the terminal leaders' aliases, and the
        events, in one statement."""
        self.finish_applied = finish_statement("t.seq, t.status, t.dedupe_key, t.alias_of", "ord")
        """:attr:`finish` returning only the position (``ord``) of each finish applied,
        not its snapshot: the same changes, without reading and sending every column of
        every finished row (see ``PostgresStorage.finish_batch_applied``)."""
        self.finish_deleting = self._finish_deleting(columns("t"), f"{TASK_COLUMNS}, ord", "*")
        """:attr:`finish` for a batch of which some finish deletes its task
        (``Finish.delete``; one more argument, $19: the delete flags): see
        :meth:`_finish_deleting`."""
        self.finish_deleting_applied = self._finish_deleting(
            "t.seq, t.status, t.dedupe_key, t.alias_of", "ord", "ord"
        )
        """:attr:`finish_deleting` returning only the position of each finish applied."""

        self.settle_aliases = (
            f"SELECT alias_seq, leader_seq FROM {s}.settle_aliases($1::bigint[]) ORDER BY alias_seq"
        )
        """Settle the aliases of terminal leaders (see the settle_aliases function)."""
        self.by_seq = f"SELECT {TASK_COLUMNS} FROM {s}.tasks WHERE seq = ANY($1::bigint[])"
        self.by_ids = (
            f"SELECT {columns('t')} FROM unnest($1::text[]) AS w(id) CROSS JOIN LATERAL"
            f" (SELECT {TASK_COLUMNS} FROM {s}.tasks AS x WHERE x.id = w.id LIMIT 1) AS t"
        )
        """The stored tasks among some (distinct) ids (the duplicate-id rule of an enqueue),
        one lookup in ``tasks_id_key`` per id. Not ``id = ANY($1)``: the generic plan of
        that, made on a connection's first enqueue into an empty table, reads the whole
        table for every later call (0.2-0.5 s per 1,000 ids at 20,000 tasks); the
        ``LIMIT`` keeps the lookup a parameterized index scan whatever the table's size
        when it was planned."""

        # -- leases -------------------------------------------------------------------------
        suspended = suspended_sql(f"{s}.suspensions", "t.task_type", "t.app_id")
        stop_request = f"coalesce(t.cancel_reason, CASE WHEN {suspended} THEN 'suspended' END)"
        leases = batch("$1::text[], $2::text[], $3::integer[]", "id, worker_id, attempt")
        held = f"SELECT t.id, {stop_request} FROM v JOIN {s}.tasks AS t ON {FENCE}"
        self.renew = (
            f"WITH {leases},"
            f" locked AS MATERIALIZED (SELECT t.seq FROM v JOIN {s}.tasks AS t ON {FENCE}"
            " FOR UPDATE OF t SKIP LOCKED),"
            f" renewed AS (UPDATE {s}.tasks AS t SET"
            " lease_expires_at = now() + $4 * interval '1 second'"
            " FROM locked WHERE t.seq = locked.seq)"
            f" {held}"
        )
        """Renew held leases without waiting for a row lock: the rows no other transaction
        holds are locked (``SKIP LOCKED``) and extended; every lease is then reported
        from the rows as last committed, so one whose row is busy (its own finish is
        being written, say) is reported held, not lost, but is not extended this time.
        Each row's stop request is the one recorded or, for a task whose scope is
        suspended now, 'suspended' (a claim that raced the suspension)."""
        self.watch = f"WITH {leases} {held}"
        """The stop requests of held leases: a plain read, which never waits for a lock."""

        progress_batch = batch(
            "$1::text[], $2::text[], $3::integer[], $4::boolean[], $5::float8[], $6::float8[],"
            " $7::text[], $8::text[]",
            "id, worker_id, attempt, has_progress, done, total, message, data",
        )
        self.save_progress = (
            f"WITH {progress_batch},"
            f" up AS (UPDATE {s}.tasks AS t SET updated_at = now(),"
            " progress_done = CASE WHEN v.has_progress THEN v.done ELSE t.progress_done END,"
            " progress_total = CASE WHEN v.has_progress THEN v.total ELSE t.progress_total END,"
            " progress_message = CASE WHEN v.has_progress THEN v.message"
            " ELSE t.progress_message END,"
            f" data = coalesce(v.data::json, t.data) FROM v WHERE {FENCE}"
            " RETURNING t.seq, t.id, v.ord),"
            f" {gate('up', 9, [notify(10, 'events')])},"
            f" ev AS (INSERT INTO {s}.events (task_seq, kind, status, at)"
            " SELECT up.seq, 'progress', 'running', now() FROM gate, up ORDER BY up.ord)"
            " SELECT id FROM up"
        )

        # -- rescue -------------------------------------------------------------------------
        rescued = f"SELECT r.seq, {_RESCUE_EVENT}, r.status, r.seq FROM r"
        rescue_sets = ", ".join(f"{c} = {e}" for c, e in _RESCUE_SETS.items())
        self.rescue = (
            "WITH e AS MATERIALIZED (SELECT seq, worker_id, attempts, started_at,"
            f" cancel_reason FROM {s}.tasks WHERE status = 'running'"
            " AND lease_expires_at <= now() ORDER BY lease_expires_at LIMIT $1"
            " FOR UPDATE SKIP LOCKED),"
            f" r AS (UPDATE {s}.tasks AS t SET {rescue_sets},"
            " updated_at = now(), worker_id = NULL, lease_expires_at = NULL"
            " FROM e WHERE t.seq = e.seq"
            f" RETURNING {columns('t')}, e.worker_id AS lost_worker, e.attempts AS lost_attempt,"
            " e.started_at AS lost_started),"
            f" log AS (INSERT INTO {s}.attempts (task_seq, number, worker_id, started_at,"
            " finished_at, outcome, error)"
            " SELECT r.seq, r.lost_attempt, coalesce(r.lost_worker, ''),"
            f" coalesce(r.lost_started, now()), now(), {_LOST}, {literal(RESCUE_ERROR)}"
            " FROM r ORDER BY r.seq),"
            f" {self._aliases_of('r')},"
            f" {self._dependents_of('r', 2, 3)},"
            f" {gate('r', 2, [notify(3, 'work'), notify(3, 'events')], also='al')},"
            f" {self._events_of(rescued)}"
            " SELECT * FROM r WHERE (SELECT count(*) FROM dp) >= 0 ORDER BY seq"
        )
        """Rescue expired leases (limit, the events lock, the channel prefix): the tasks, their
        LOST execution-log rows, the aliases of those that failed or were cancelled,
        and the events, in one statement."""

        # -- redrive ------------------------------------------------------------------------
        self.lock_for_redrive = (
            "SELECT seq, status, alias_of, app_id, task_type, dedupe_key"
            f" FROM {s}.tasks WHERE id = $1 FOR UPDATE"
        )
        self.find_leader = (
            f"SELECT id FROM {s}.tasks WHERE coalesce(app_id, '') = coalesce($1::text, '')"
            " AND (app_id IS NULL) = ($1::text IS NULL) AND task_type = $2"
            f" AND dedupe_key = $3 AND alias_of IS NULL AND {ACTIVE}"
        )
        self.redrive = (
            f"UPDATE {s}.tasks SET status = 'pending', attempts = 0, result = NULL,"
            " error = NULL, cancel_reason = NULL, progress_done = 0, progress_total = NULL,"
            " progress_message = NULL, run_at = now(), updated_at = now(), started_at = NULL,"
            f" finished_at = NULL, waiting_on = (SELECT count(*) FROM {s}.task_dependencies"
            f" AS e WHERE e.task_id = {s}.tasks.id) WHERE seq = $1 RETURNING {TASK_COLUMNS}"
        )

        # -- reading ------------------------------------------------------------------------
        self.get = f"SELECT {TASK_COLUMNS} FROM {s}.tasks WHERE id = $1"
        self.attempts = (
            "SELECT number, worker_id, started_at, finished_at, outcome, error"
            f" FROM {s}.attempts WHERE task_seq = (SELECT seq FROM {s}.tasks WHERE id = $1)"
            " ORDER BY id"
        )
        self.next_run_at = (
            "SELECT min(m.run_at) FROM unnest($1::text[], $2::text[]) AS k(task_type, app_id)"
            f" CROSS JOIN LATERAL (SELECT min(t.run_at) AS run_at FROM {s}.tasks AS t"
            f" WHERE t.{CLAIMABLE} AND t.task_type = k.task_type"
            " AND (k.app_id IS NULL OR t.app_id = k.app_id)"
            f" AND NOT {suspended}) AS m"
        )

        # -- retention ----------------------------------------------------------------------
        self.cleanup = (
            f"WITH d AS (DELETE FROM {s}.tasks WHERE finished_at < now() - $1 * interval"
            " '1 second' AND status = ANY($2::text[]) RETURNING seq, id),"
            f" a AS (DELETE FROM {s}.attempts WHERE task_seq IN (SELECT seq FROM d)),"
            f" w AS (DELETE FROM {s}.task_dependencies WHERE task_id IN (SELECT id FROM d))"
            " SELECT count(*) FROM d"
        )

        # -- control ------------------------------------------------------------------------
        self.children = (
            f"SELECT id, parent_id FROM {s}.tasks WHERE parent_id = ANY($1::text[]) ORDER BY seq"
        )
        self.lock_active = (
            "SELECT seq, id, status, worker_id, attempts, started_at, alias_of"
            f" FROM {s}.tasks WHERE id = ANY($1::text[]) AND {ACTIVE} ORDER BY seq FOR UPDATE"
        )
        self.cancel = (
            f"UPDATE {s}.tasks SET {_CANCELLATION_SET}, updated_at = now(), worker_id = NULL,"
            f" lease_expires_at = NULL WHERE id = ANY($2::text[]) AND {ACTIVE}"
            f" RETURNING {TASK_COLUMNS}"
        )
        self.request_stop = (
            f"UPDATE {s}.tasks SET cancel_reason = $1, updated_at = now()"
            " WHERE id = ANY($2::text[]) AND status = 'running' AND cancel_reason IS NULL"
            f" RETURNING {TASK_COLUMNS}"
        )
        self.log_cancelled = (
            f"INSERT INTO {s}.attempts (task_seq, number, worker_id, started_at, finished_at,"
            " outcome, error) SELECT a.seq, a.number, a.worker_id, coalesce(a.started, now()),"
            f" now(), {literal(_CANCELLED_OUTCOME)}, $5 FROM unnest($1::bigint[], $2::integer[],"
            " $3::text[], $4::timestamptz[]) WITH ORDINALITY"
            " AS a(seq, number, worker_id, started, ord) ORDER BY a.ord"
        )
        """Log the attempts of running tasks a terminal cancel interrupted."""
        self.suspend = (
            f"WITH ins AS (INSERT INTO {s}.suspensions (task_type, app_id, created_at)"
            " VALUES ($1, $2, now()) ON CONFLICT DO NOTHING RETURNING 1),"
            f" asked AS (UPDATE {s}.tasks SET cancel_reason = 'suspended', updated_at = now()"
            " WHERE status = 'running' AND cancel_reason IS NULL"
            " AND ($1::text IS NULL OR task_type = $1) AND ($2::text IS NULL OR app_id = $2)"
            " RETURNING seq),"
            f" {gate('asked', 3, [notify(4, 'control'), notify(4, 'events')])},"
            f" ev AS (INSERT INTO {s}.events (task_seq, kind, status, at)"
            " SELECT asked.seq, 'cancel_requested', 'running', now() FROM gate, asked"
            " ORDER BY asked.seq),"
            # Workers also look at stored suspensions when they check their leases.
            f" told AS MATERIALIZED (SELECT {notify(4, 'control')} FROM ins)"
            " SELECT (SELECT count(*) FROM asked), (SELECT count(*) FROM told)"
        )
        self.resume = (
            f"WITH d AS (DELETE FROM {s}.suspensions WHERE task_type IS NOT DISTINCT FROM $1"
            " AND app_id IS NOT DISTINCT FROM $2 RETURNING 1),"
            f" told AS MATERIALIZED (SELECT {notify(3, 'work')} FROM d)"
            " SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM told)"
        )
        self.suspensions = f"SELECT task_type, app_id FROM {s}.suspensions"

        # -- dependencies -------------------------------------------------------------------
        self.lock_dependencies = (
            f"SELECT id, status, app_id FROM {s}.tasks WHERE id = ANY($1::text[]) FOR SHARE"
        )
        """The dependencies of an enqueue, share-locked: a dependency finishing meanwhile
        either committed first (its status is read here) or waits for this enqueue (and
        its settle_dependents then finds the edges written here)."""
        self.insert_dependencies = (
            f"INSERT INTO {s}.task_dependencies (depends_on, task_id, always)"
            " SELECT * FROM unnest($1::text[], $2::text[], $3::boolean[]) ON CONFLICT DO NOTHING"
        )
        self.cancel_for_dependency = (
            f"UPDATE {s}.tasks SET {_DEPENDENCY_CANCEL_SET}, updated_at = now(),"
            f" worker_id = NULL, lease_expires_at = NULL WHERE id = $1 AND status = 'pending'"
            f" RETURNING {TASK_COLUMNS}"
        )
        """A new task cancelled at once: a dependency had already ended without completing
        (parameters: its id, the error); no row when it is no longer PENDING (an alias its
        blocked leader settled)."""
        self.settle_dependents = f"SELECT {s}.settle_dependents($1::bigint[], $2, $3)"

        # -- the event log --------------------------------------------------------------------
        self.read_events = (
            "SELECT e.seq, e.kind, e.status, e.at,"
            f" {', '.join(f'coalesce(t.{c}, g.{c}) AS {c}' for c in TASK_COLUMN_NAMES)}"
            f" FROM {s}.events AS e LEFT JOIN {s}.tasks AS t ON t.seq = e.task_seq"
            f" LEFT JOIN LATERAL (SELECT {TASK_COLUMNS} FROM {s}.tombstones AS g"
            " WHERE t.seq IS NULL AND g.seq = e.task_seq OFFSET 0) AS g ON true"
            " WHERE e.seq > $1 ORDER BY e.seq LIMIT $2"
        )
        """The events after a seq, each with its task's columns: from its row or, when a
        deleting finish removed the task, from its tombstone; all NULL for a task
        deleted by cleanup. At most one of ``t`` and ``g`` has a row, so ``coalesce``
        takes each column from it. The tombstone is looked up only for an event whose
        task row is gone: ``OFFSET 0`` keeps the lateral subquery from being merged into
        the join, so its test of ``t.seq`` is a one-time filter checked before the
        lookup, and reading the events of kept tasks costs no lookup more."""
        self.deleted_task = f"SELECT {TASK_COLUMNS} FROM {s}.tombstones WHERE id = $1"
        self.last_event = f"SELECT max(seq) FROM {s}.events"
        self.event_counter = (
            f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {s}.event_cursor"
        )
        self.prune_events = (
            f"WITH g AS (DELETE FROM {s}.tombstones"
            " WHERE deleted_at < now() - $1 * interval '1 second')"
            f" DELETE FROM {s}.events WHERE seq < coalesce((SELECT seq FROM {s}.events"
            " WHERE at >= now() - $1 * interval '1 second' ORDER BY seq LIMIT 1),"
            " 9223372036854775807)"
        )
        """Delete the events older than $1 seconds (the prefix of the log before the
        first younger one) and the tombstones of tasks deleted as long ago; the status
        counts the events."""

    def _finish_deleting(self, returning: str, selected: str, result: str) -> str:
        """The finish statement of a batch of which some finish deletes its task: the
        arguments of :attr:`finish`, then $19, the delete flags. ``returning``: the
        updated rows' columns that ``selected`` (the columns of the result rows, read
        from the updated and the deleted rows alike) and ``result`` need.

        What a finish that does not delete does is :attr:`finish`'s, written the same
        way. A deleting COMPLETE (``gone``) does not update its row: it deletes it,
        returning the row the update would have written, and writes that as the
        tombstone; its earlier attempts are deleted and this one is not logged. Its
        aliases take its result from the tombstone (``settle_aliases_of_deleted``), its
        dependents are settled by id (the four-argument ``settle_dependents``). A
        deleting FAIL updates its row as any FAIL (a stop request committed meanwhile
        makes it a RELEASE, which keeps the task; only the update decides that), and is
        deleted, after its aliases and dependents are settled, by ``forget_tasks``
        (``fg``), with its aliases and those of the deleted COMPLETEs. So every alias
        and dependent is settled as keep mode settles it, from the values the deleted
        task ended with (see 0008_tombstones.sql), and the events are keep mode's.

        Whether a finish deletes without an update depends on its batch row only
        (``v``), so each batch row reaches its task once, by one of the two
        statements."""
        s = self.quoted
        gone_kind = f"v.del AND v.kind = {literal(FinishKind.COMPLETE.value)}"
        written = {
            **_COMPLETE_SETS,
            "updated_at": "now()",
            "worker_id": "NULL::text",
            "lease_expires_at": "NULL::timestamptz",
            "data": "coalesce(v.data::json, t.data)",
        }
        gone_columns = ", ".join(f"{written.get(c, f't.{c}')} AS {c}" for c in TOMBSTONE_COLUMNS)
        kept = ", ".join(TOMBSTONE_COLUMNS)
        replaced = ", ".join(
            f"{c} = EXCLUDED.{c}" for c in (*TOMBSTONE_COLUMNS, "deleted_at") if c != "id"
        )
        logged = outcome_sql(FINISHES.values(), released="d.released", reported="d.outcome")
        requeued = f"(SELECT {notify(18, 'work')} FROM done WHERE status = 'pending' LIMIT 1)"
        deletable = ", ".join(literal(status.value) for status in DELETED_ON_FINISH)
        return (
            f"WITH {batch(_FINISH_ARRAYS + ', $19::boolean[]', _FINISH_BATCH_COLUMNS + ', del')},"
            f" done AS (UPDATE {s}.tasks AS t SET {_FINISH_SET_LIST},"
            " updated_at = now(), worker_id = NULL, lease_expires_at = NULL,"
            " data = coalesce(v.data::json, t.data)"
            f" FROM v WHERE {FENCE} AND NOT ({gone_kind})"
            f" RETURNING {returning}, v.ord, t.attempts < v.attempt AS released,"
            " v.attempt, v.worker_id AS lease_worker, v.started_at AS attempt_started,"
            " v.finished_at AS attempt_finished, v.outcome, v.error AS attempt_error,"
            f" v.del AND t.status IN ({deletable}) AS doomed),"
            f" gone AS (DELETE FROM {s}.tasks AS t USING v WHERE {FENCE} AND {gone_kind}"
            f" RETURNING {gone_columns}, v.ord),"
            f" kept AS (INSERT INTO {s}.tombstones ({kept}, deleted_at)"
            f" SELECT {kept}, now() FROM gone ON CONFLICT (id) DO UPDATE SET {replaced}"
            " RETURNING seq, dedupe_key, alias_of),"
            f" erased AS (DELETE FROM {s}.attempts"
            " WHERE task_seq = ANY(ARRAY(SELECT seq FROM gone))),"
            f" log AS (INSERT INTO {s}.attempts (task_seq, number, worker_id, started_at,"
            " finished_at, outcome, error)"
            " SELECT d.seq, d.attempt, d.lease_worker, d.attempt_started, d.attempt_finished,"
            " o.outcome, CASE WHEN o.outcome = 'completed' THEN NULL ELSE d.attempt_error END"
            f" FROM done AS d CROSS JOIN LATERAL (SELECT {logged} AS outcome) AS o"
            " WHERE NOT d.doomed ORDER BY d.ord),"
            # The aliases settled: of the updated leaders that ended, from their rows; of
            # the deleted ones, from their tombstones (read by seq: kept is written first).
            " al AS MATERIALIZED (SELECT s.alias_seq, s.leader_seq, false AS gone FROM"
            " (SELECT array_agg(c.seq) AS seqs FROM done AS c"
            f" WHERE c.dedupe_key IS NOT NULL AND c.alias_of IS NULL AND c.status IN ({_TERMINAL})"
            " HAVING count(*) > 0) AS x"
            f" CROSS JOIN LATERAL {s}.settle_aliases(x.seqs) AS s"
            " UNION ALL SELECT s.alias_seq, s.leader_seq, true FROM"
            " (SELECT array_agg(k.seq) AS seqs FROM kept AS k"
            " WHERE k.dedupe_key IS NOT NULL AND k.alias_of IS NULL"
            " HAVING count(*) > 0) AS x"
            f" CROSS JOIN LATERAL {s}.settle_aliases_of_deleted(x.seqs) AS s),"
            # Dependents: of the rows that ended and the aliases, by seq; of the deleted
            # rows, by id.
            f" dp AS MATERIALIZED (SELECT {s}.settle_dependents(coalesce(x.seqs, '{{}}'),"
            " $17, $18, coalesce(y.ids, '{}')) AS cancelled FROM"
            " (SELECT array_agg(z.seq) AS seqs FROM (SELECT c.seq FROM done AS c"
            f" WHERE c.status IN ({_TERMINAL}) UNION ALL SELECT al.alias_seq FROM al) AS z) AS x"
            " CROSS JOIN (SELECT array_agg(g.id) AS ids FROM gone AS g) AS y"
            " WHERE x.seqs IS NOT NULL OR y.ids IS NOT NULL),"
            # Then the deleting FAILs and the aliases of every deleted leader go: the
            # aliases are told apart by a window over their leader's seq, not a join.
            f" fg AS MATERIALIZED (SELECT {s}.forget_tasks(x.seqs) AS n FROM"
            " (SELECT array_agg(w.seq) AS seqs FROM (SELECT z.seq,"
            " bool_or(z.doomed) OVER (PARTITION BY z.leader) AS doomed FROM"
            " (SELECT d.seq, d.seq AS leader, true AS doomed FROM done AS d WHERE d.doomed"
            " UNION ALL SELECT al.alias_seq, al.leader_seq, al.gone FROM al) AS z) AS w"
            " WHERE w.doomed HAVING count(*) > 0) AS x WHERE (SELECT count(*) FROM dp) >= 0),"
            " fin AS (SELECT d.seq, d.status, d.released, d.ord FROM done AS d"
            " UNION ALL SELECT g.seq, g.status, false, g.ord FROM gone AS g),"
            f" {gate('fin', 17, [notify(18, 'events'), requeued], also='al')},"
            f" {self._events_of(f'SELECT d.seq, {_FINISH_EVENT}, d.status, d.ord FROM fin AS d')}"
            # dp runs before fg (fg's one-time filter reads it), fg before the result.
            f" SELECT {result} FROM (SELECT {selected} FROM done UNION ALL"
            f" SELECT {selected} FROM gone) AS r"
            " WHERE (SELECT count(*) FROM fg) >= 0 AND (SELECT count(*) FROM dp) >= 0"
        )

    def _aliases_of(self, changed: str) -> str:
        """The CTE ``al`` (alias seq, leader seq): the aliases settled for the terminal
        dedupe leaders among the rows of the CTE ``changed`` (the function is not
        called at all when there are none)."""
        return (
            f"al AS MATERIALIZED (SELECT s.alias_seq, s.leader_seq FROM"
            f" (SELECT array_agg(c.seq) AS seqs FROM {changed} AS c"
            " WHERE c.dedupe_key IS NOT NULL AND c.alias_of IS NULL"
            f" AND c.status IN ({_TERMINAL}) HAVING count(*) > 0) AS x"
            f" CROSS JOIN LATERAL {self.quoted}.settle_aliases(x.seqs) AS s)"
        )

    def _dependents_of(self, changed: str, lock: int, channel: int) -> str:
        """The CTE ``dp``: the dependents of the tasks among the rows of ``changed`` (and
        the aliases ``al`` settled) settled by the settle_dependents function, which
        yields the seqs of those it cancelled. Whether any edge exists is for the
        function to read: its fresh snapshot sees edges an enqueue committed while this
        statement waited for a dependency's row, this statement's snapshot does not."""
        return (
            f"dp AS MATERIALIZED (SELECT {self.quoted}.settle_dependents(x.seqs, ${lock},"
            f" ${channel}) AS cancelled FROM (SELECT array_agg(y.seq) AS seqs FROM"
            f" (SELECT c.seq FROM {changed} AS c WHERE c.status IN ({_TERMINAL})"
            " UNION ALL SELECT al.alias_seq FROM al) AS y HAVING count(*) > 0) AS x)"
        )

    def _events_of(self, changed: str) -> str:
        """The CTE ``ev``: behind the gate, the events of the rows ``changed`` selects
        (task seq, event kind, status, position) in position order, each followed by
        those of the aliases it settled (``al``, in creation order), which take its kind
        and status.

        Each alias is placed after its leader by sorting the two together (a window over
        the leader's seq), not by joining ``al`` to the changed rows: a join of two CTEs
        may become a nested loop that reads one of them once per row of the other."""
        return (
            f"ev AS (INSERT INTO {self.quoted}.events (task_seq, kind, status, at)"
            " SELECT e.seq, e.kind, e.status, now() FROM gate, ("
            " SELECT x.seq, first_value(x.kind) OVER w AS kind,"
            " first_value(x.status) OVER w AS status, first_value(x.pos) OVER w AS pos, x.o2"
            " FROM (SELECT c.seq, c.seq AS leader, c.kind, c.status, c.pos, 0::bigint AS o2"
            f" FROM ({changed}) AS c(seq, kind, status, pos) UNION ALL"
            " SELECT al.alias_seq, al.leader_seq, NULL, NULL, NULL, al.alias_seq FROM al) AS x"
            " WINDOW w AS (PARTITION BY x.leader ORDER BY x.o2)) AS e ORDER BY e.pos, e.o2)"
        )

    # -- claims -------------------------------------------------------------------------

    def claim(self, shape: ClaimShape) -> str:
        """The claim statement of ``shape`` (cached: a handful of shapes per worker)."""
        cached = self._claim_cache.get(shape)
        if cached is None:
            cached = self._claim_cache[shape] = self._build_claim(shape)
        return cached

    def _build_claim(self, shape: ClaimShape) -> str:
        # Arguments, in order: worker id, lease seconds, events lock, channel, limit,
        # [min priority], then per branch: task type, [app id | excluded apps], take.
        s = self.quoted
        n = 6
        prio = ""
        if shape.min_priority:
            prio = f" AND t.priority >= ${n}::bigint"
            n += 1
        branches: list[str] = []
        for app_key, excludes in shape.branches:
            task_type = f"${n}::text"
            n += 1
            if app_key:
                app = f" AND t.app_id = ${n}::text"
                # One-time filter: this key's whole scope is suspended, or not at all.
                covered = f"(s.app_id IS NULL OR s.app_id = ${n}::text)"
                per_row = ""
                n += 1
            else:
                app = ""
                if excludes:
                    app = f" AND (t.app_id IS NULL OR t.app_id <> ALL(${n}::text[]))"
                    n += 1
                covered = "s.app_id IS NULL"
                # Apps suspended one by one are left out row by row.
                per_row = (
                    f" AND NOT EXISTS (SELECT 1 FROM {s}.suspensions AS s"
                    " WHERE s.app_id = t.app_id AND (s.task_type IS NULL"
                    f" OR s.task_type = {task_type}))"
                )
            take = f"${n}::bigint"
            n += 1
            branches.append(
                f"SELECT t.seq, t.priority FROM {s}.tasks AS t"
                f" WHERE t.{CLAIMABLE} AND t.task_type = {task_type}{app}"
                f" AND t.run_at <= now(){prio}"
                f" AND NOT EXISTS (SELECT 1 FROM {s}.suspensions AS s"
                f" WHERE (s.task_type IS NULL OR s.task_type = {task_type})"
                f" AND {covered}){per_row}"
                f" ORDER BY t.priority DESC, t.seq LIMIT {take}"
                " FOR UPDATE OF t SKIP LOCKED"
            )
        union = " UNION ALL ".join(f"SELECT * FROM ({b}) AS b{i}" for i, b in enumerate(branches))
        return (
            f"WITH picked AS MATERIALIZED (SELECT seq, priority FROM ({union}) AS u"
            " ORDER BY priority DESC, seq LIMIT $5::bigint),"
            f" claimed AS (UPDATE {s}.tasks AS t SET status = 'running',"
            " attempts = t.attempts + 1, worker_id = $1::text, started_at = now(),"
            " updated_at = now(), lease_expires_at = now() + $2::float8 * interval '1 second'"
            f" WHERE t.seq = ANY(ARRAY(SELECT seq FROM picked)) RETURNING {columns('t')}),"
            f" {gate('claimed', 3, [notify(4, 'events')])},"
            f" ev AS (INSERT INTO {s}.events (task_seq, kind, status, at)"
            " SELECT c.seq, 'started', 'running', now() FROM gate, claimed AS c"
            " ORDER BY c.priority DESC, c.seq)"
            " SELECT * FROM claimed"
        )

    def claim_arguments(
        self, request: ClaimRequest, lock: int, channel: str
    ) -> tuple[str, list[Any]] | None:
        """The claim statement serving ``request`` and its arguments; None when it
        cannot claim anything.

        Each handler key draws at most its cap (or ``limit``) of its best due tasks
        through the partial ``tasks_claim`` index, skipping rows other claims hold
        (``FOR UPDATE SKIP LOCKED``); a task of an app with its own key is served only
        by that key, never by the host key. The keys' candidates are merged by
        priority DESC, then creation, and cut to ``limit``. Suspensions are checked in
        the statement itself, so one committed before it began is always honoured: a
        key whose whole scope is suspended is skipped by a one-time filter without
        touching the index; apps suspended one by one are left out row by row.
        """
        limit = request.limit
        if limit <= 0:
            return None
        own_apps: dict[str, list[str]] = {}
        for app_id, task_type in request.handlers:
            if app_id is not None:
                own_apps.setdefault(task_type, []).append(app_id)
        args: list[Any] = [request.worker_id, float(request.lease_seconds), lock, channel, limit]
        if request.min_priority is not None:
            args.append(int(request.min_priority))
        branches: list[tuple[bool, bool]] = []
        for (app_id, task_type), cap in request.handlers.items():
            take = limit if cap is None else min(cap, limit)
            if take <= 0:
                continue
            args.append(task_type)
            if app_id is not None:
                branches.append((True, False))
                args.append(app_id)
            else:
                excluded = own_apps.get(task_type)
                branches.append((False, bool(excluded)))
                if excluded:
                    args.append(excluded)
            args.append(take)
        if not branches:
            return None
        shape = ClaimShape(tuple(branches), request.min_priority is not None)
        return self.claim(shape), args


DIALECT: Final = Dialect(
    placeholder=lambda n, sql_type: f"${n}::{sql_type}", arrays=True, timestamp=lambda at: at
)
"""PostgreSQL for :func:`taskmill.sql.filters.translate` (asyncpg binds datetimes)."""


def filter_sql(f: TaskFilter, first: int = 1) -> tuple[str, list[Any]]:
    """A boolean SQL expression selecting what ``f`` selects ("true" for everything),
    with its arguments numbered from ``$first``."""
    selected = translate(f, DIALECT, first=first)
    return selected.expression, selected.args
