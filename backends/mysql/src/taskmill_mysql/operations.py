"""The domain operations of the MySQL backend, as async functions of a
:class:`~taskmill_mysql.connection.Session`.

Each write runs inside one short ``READ COMMITTED`` transaction (see
:meth:`~taskmill_mysql.connection.Database.run`), reads run on their own. The
transitions are the lifecycle kernel's (:mod:`taskmill.lifecycle`): statements come
from :mod:`taskmill_mysql.statements`, and every event kind, attempt outcome and rescue
or redrive decision is read from the kernel. Without ``RETURNING``, an operation locks
its rows first (``FOR UPDATE``; ``SKIP LOCKED`` for claims and rescues), updates them by
``seq`` and reads them back in the same transaction. The store clock is the server's
(``NOW(6)``, read once per operation).

Why one long module: one short function per operation of the storage contract (the
same transaction boundary as SQLite's operations.py), sharing the helpers that lock,
read back, settle aliases and append events; splitting them by topic would scatter
those helpers. The SQL, rows, options, schema and connections live in their own modules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

import attrs
from taskmill.cursors import position_token, token_position
from taskmill.errors import TaskNotFound
from taskmill.lifecycle import (
    CANCELLATION,
    DEFAULT_CANCEL_REASON,
    FINISHES,
    REDRIVE_EVENT,
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
    plan,
    rescue_case,
    settles_aliases,
    split_taken,
    unknown_dependency,
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
from taskmill.serialization import dumps, loads
from taskmill.sql.rows import REASON, STATUS, leads_aliases
from taskmill.storage import (
    ClaimRequest,
    Finish,
    FinishKind,
    HandlerKey,
    HandlerRegistration,
    Lease,
    NewTask,
    ProgressUpdate,
)

from taskmill_mysql import statements as sql
from taskmill_mysql.connection import Session
from taskmill_mysql.limits import apply_limits, spend_tokens
from taskmill_mysql.packets import CHUNK, text_bytes
from taskmill_mysql.rows import (
    CANCEL_REASON,
    ERROR,
    EVENT_COLUMNS,
    ID,
    NARROW_FENCE,
    PRIORITY,
    RESULT,
    SEQ,
    SNAPSHOT_FENCE,
    STATUS_COL,
    TASK_COLUMNS,
    Row,
    as_datetime,
    as_stored,
    attempt,
    claimed_row,
    event,
    fence_from_json,
    from_json,
    task,
)

_TERMINAL_EVENT: Final = {s.value: e.value for s, e in TERMINAL_EVENTS.items()}
_ENQUEUED: Final = EventKind.ENQUEUED.value
_STARTED: Final = EventKind.STARTED.value
_CANCEL_REQUESTED: Final = EventKind.CANCEL_REQUESTED.value
_CANCELLED_EVENT: Final = CANCELLATION.event.value
_RELEASED: Final = EventKind.RELEASED.value
_TERMINAL: Final = frozenset(_TERMINAL_EVENT)
assert CANCELLATION.outcome is not None
_CANCELLED_OUTCOME: Final = CANCELLATION.outcome.value
_PROGRESS: Final = EventKind.PROGRESS.value
_COMPLETED: Final = AttemptOutcome.COMPLETED.value
_APPLIED: Final = {
    kind: (t.event.value, None if t.outcome is None else t.outcome.value)
    for kind, t in FINISHES.items()
}
"""Per finish kind: its event, and the outcome it logs (None: the worker's)."""

Event = tuple[int, str, str, str, datetime]
"""An event to append: (task seq, task id, kind, status, at)."""


def _chunks(items: Sequence[Any], size: int = CHUNK) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


async def now(s: Session) -> datetime:
    """The store clock (naive UTC, as stored)."""
    row = await s.fetchone(sql.NOW)
    assert row is not None
    value: datetime = row[0]
    return value


@attrs.frozen
class Inserted:
    """The seqs of the tasks one multi-row ``INSERT`` stored: ``first``, ``first +
    step``, ... (``count`` of them), in the order of its rows."""

    first: int
    step: int
    count: int

    @property
    def last(self) -> int:
        return self.first + self.step * (self.count - 1)


_QUOTED: Final = {
    value: f"'{value}'"
    for value in [
        *(k.value for k in EventKind),
        *(t.value for t in TaskStatus),
        *(o.value for o in AttemptOutcome),
    ]
}
"""Event kinds, statuses and attempt outcomes as SQL literals (plain words: nothing to
escape)."""
Literal = Callable[[Any], str]
""":meth:`Session.literal`."""


async def append_events(
    s: Session,
    events: list[Event],
    *,
    enqueued: Sequence[Inserted] = (),
    at: datetime | None = None,
) -> None:
    """Append the ENQUEUED events of the tasks ``enqueued`` (written at ``at``), then
    ``events``, in order, drawing their seqs from the locked ``event_cursor`` row: the
    last statements of a transaction (deferred, so they go to the server with the
    ``COMMIT``), so that the row lock is held only from here to the commit and seqs
    follow commit order. The draw leaves the last seq in ``LAST_INSERT_ID()``, from
    which the ``INSERT`` numbers the events on the server; the events of ``enqueued``
    are copied from their task rows there (nothing rendered per task)."""
    count = len(events) + sum(inserted.count for inserted in enqueued)
    if not count:
        return
    s.defer(sql.EVENT_CURSOR_DRAW, (count,))
    back = count
    for inserted in enqueued:
        back -= inserted.count
        s.defer(
            sql.INSERT_ENQUEUED_EVENTS,
            (back + inserted.count - 1, inserted.first, inserted.step, at, inserted.first,
             inserted.last),
        )  # fmt: skip
    literal = s.literal
    rows: list[str] = []
    for seq, task_id, kind, status, when in events:
        back -= 1
        rows.append(
            f"(LAST_INSERT_ID() - {back:d}, {seq:d}, {literal(task_id)}, "
            f"{_QUOTED[kind]}, {_QUOTED[status]}, {literal(when)})"
        )
    s.defer_values(sql.INSERT_EVENTS, rows)


async def _by_seq(s: Session, seqs: Sequence[int]) -> list[Row]:
    rows: list[Row] = []
    for chunk in _chunks(seqs):
        rows += await s.fetchall(sql.select_by_seq(len(chunk)), chunk)
    return rows


async def _snapshots(s: Session, text: str, args: Sequence[Any]) -> list[Row]:
    """The rows of a query selecting :data:`~taskmill_mysql.rows.TASK_JSON` and maybe
    more columns, each as :data:`TASK_COLUMNS` followed by those more columns, in the
    query's order (a row the server gave no JSON for is read again by its seq)."""
    rows: list[Row] = []
    missing: dict[int, int] = {}
    for found in await s.fetchall(text, args):
        row = from_json(found)
        if row is None:
            missing[found[1]] = len(rows)
            row = found
        rows.append(row)
    if missing:
        for full in await _by_seq(s, list(missing)):
            at = missing[full[SEQ]]
            rows[at] = (*full, *rows[at][2:])
    return rows


async def _settle_aliases(s: Session, leader: Row, at: datetime, events: list[Event]) -> list[Row]:
    """Give a terminal leader's PENDING aliases its status, result, error and cancel
    reason; append their events (the leader's terminal kind).

    :returns: the aliases' new rows, in creation order.
    """
    locked = await s.fetchall(sql.LOCK_ALIASES, (leader[ID],))
    if not locked:
        return []
    status = leader[STATUS_COL]
    s.defer(
        sql.SETTLE_ALIASES,
        (status, leader[RESULT], leader[ERROR], leader[CANCEL_REASON], at, at, leader[ID]),
    )
    rows = await _by_seq(s, [r[0] for r in locked])
    kind = _TERMINAL_EVENT[status]
    events += [(r[SEQ], r[ID], kind, status, at) for r in rows]
    return rows


# -- writing tasks -----------------------------------------------------------------------


async def _dependencies(s: Session, tasks: Sequence[NewTask]) -> dict[str, tuple[str, str | None]]:
    """The (status, app id) of every task ``tasks`` depend on, share-locked; refuses a
    dependency that does not exist or is another app's (before anything is written)."""
    wanted = list(dict.fromkeys(d for new in tasks for d in new.after))
    found: dict[str, tuple[str, str | None]] = {}
    for chunk in _chunks(wanted):
        for task_id, status, app_id in await s.fetchall(sql.lock_dependencies(len(chunk)), chunk):
            found[task_id] = (status, app_id)
    for new in tasks:
        for dependency in new.after:
            if dependency not in found:
                raise unknown_dependency(dependency, new.app_id, None)
            if found[dependency][1] != new.app_id:
                raise unknown_dependency(dependency, new.app_id, found[dependency][1])
    return found


async def settle_dependents(
    s: Session, ended: list[tuple[str, str]], at: datetime, events: list[Event]
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
            found = await s.fetchall(sql.lock_edges(len(chunk)), chunk)
            if found:
                edges += found
                s.defer(sql.delete_edges(len(chunk)), chunk)
        level = []
        for dependency, dependent_id, always in edges:
            s.defer(sql.COUNT_DOWN, (dependent_id,))
            row = await s.fetchone(sql.WAITING_OF, (dependent_id,))
            if row is None:
                continue  # deleted by cleanup
            seq, status, left = row
            ended_as = STATUS[status_of[dependency]]
            blocks = bool(dependency_blocks(ended_as, bool(always)))
            outcome = dependency_settles(STATUS[status], left, blocks=blocks)
            if outcome is DependentOutcome.RELEASED:
                events.append((seq, dependent_id, _RELEASED, "pending", at))
            elif outcome is DependentOutcome.CANCELLED:
                error = dependency_error(dependency, ended_as)
                s.defer(sql.DEPENDENCY_CANCEL, {"now": at, "error": error, "seq": seq})
                events.append((seq, dependent_id, _CANCELLED_EVENT, "cancelled", at))
                cancelled += await _by_seq(s, [seq])
                level.append((dependent_id, "cancelled"))
    return cancelled


async def enqueue(s: Session, args: tuple[Sequence[NewTask], bool]) -> list[Task]:
    """Insert ``tasks``; with ``look_up_ids`` the stored tasks among their ids are read
    first (the duplicate-id rule), without it the unique ``tasks_id`` index refuses a
    stored id (the caller then runs it again with ``look_up_ids``)."""
    tasks, look_up_ids = args
    at = await now(s)
    at_dt = as_datetime(at)
    leaders: dict[tuple[str | None, str, str], str] = {}
    values: list[list[Any]] = []
    stored: list[Task] = []
    ids = list(dict.fromkeys(new.id for new in tasks)) if look_up_ids else []
    taken: dict[str, Task] = {}
    for chunk in _chunks(ids):
        for row in await s.fetchall(sql.select_tasks_by_id(len(chunk)), list(chunk)):
            snapshot = task(row)
            taken[snapshot.id] = snapshot
    fresh, known = split_taken(tasks, taken)
    statuses = await _dependencies(s, fresh) if any(new.after for new in fresh) else {}
    edges: list[tuple[str, str, bool]] = []
    blocked: dict[int, tuple[str, str]] = {}  # index in fresh -> the dependency that cancels it
    for index, new in enumerate(fresh):
        waiting = 0
        for dependency in new.after:
            status = statuses[dependency][0]
            blocks = dependency_blocks(STATUS[status], new.after_always)
            if blocks is None:
                waiting += 1
                edges.append((dependency, new.id, new.after_always))
            elif blocks and index not in blocked:
                blocked[index] = (dependency, status)
        alias_of: str | None = None
        key = new.dedupe_key
        if key is not None:
            scope = (new.app_id, new.task_type, key)
            alias_of = leaders.get(scope)
            if alias_of is None:
                found = await s.fetchone(sql.FIND_LEADER, (new.app_id, new.task_type, key))
                if found is None:
                    leaders[scope] = new.id
                else:
                    alias_of = leaders[scope] = found[0]
        run_at = at if new.run_at is None else as_stored(new.run_at)
        values.append(
            [
                new.id, new.task_type, at, run_at, at, new.app_id, new.params_json,
                int(new.priority), new.max_retries, key, alias_of, new.parent_id, new.user_id,
                waiting,
            ]
        )  # fmt: skip
        stored.append(enqueued(new, now=at_dt, run_at=as_datetime(run_at), alias_of=alias_of))
    seq_of: dict[str, int] = {}
    ranges: list[Inserted] | None = []
    rendered = _task_rows(s, values)
    for run in s.value_runs(sql.INSERT_PREFIX, rendered):
        # Each INSERT (as many rows as fit a packet), then its seqs: LAST_INSERT_ID()
        # is the first seq of the last INSERT.
        s.defer_run(sql.INSERT_PREFIX, rendered, run)
        ids = [row[0] for row in values[run[0] : run[1]]]
        found = await s.fetchone(sql.INSERTED_SEQS, (ids[-1],))
        assert found is not None
        inserted = Inserted(int(found[0]), int(found[1]), len(ids))
        if found[2] == inserted.last:
            seqs = range(inserted.first, inserted.last + 1, inserted.step)
            seq_of.update(zip(ids, seqs, strict=True))
            if ranges is not None:
                ranges.append(inserted)
        else:  # not the seqs an InnoDB simple insert reserves: read them
            seq_of.update(await s.fetchall(sql.select_seqs_by_id(len(ids)), ids))
            ranges = None
    events: list[Event] = []
    if ranges is None:  # the events rendered one by one, in order
        events += [(seq_of[t.id], t.id, _ENQUEUED, "pending", at) for t in stored]
    if edges:
        await s.executemany(sql.INSERT_DEPENDENCY, edges)
    for index, (dependency, status) in blocked.items():
        seq = seq_of[fresh[index].id]
        error = dependency_error(dependency, STATUS[status])
        s.defer(sql.DEPENDENCY_CANCEL, {"now": at, "error": error, "seq": seq})
        (row,) = await _by_seq(s, [seq])
        events.append((seq, row[ID], _CANCELLED_EVENT, "cancelled", at))
        stored[index] = task(row)
    await append_events(s, events, enqueued=ranges or (), at=at)
    known.update((t.id, t) for t in stored)
    return [known[new.id] for new in tasks]


def _task_rows(s: Session, rows: Sequence[list[Any]]) -> list[str]:
    """``rows`` (id, task type, created, run at, updated, app id, params, priority, max
    retries, dedupe key, alias of, parent id, user id, waiting on) as the rendered rows
    of :data:`~taskmill_mysql.statements.INSERT_PREFIX`, each in one format: the largest
    Python cost of a bulk enqueue was rendering row by row."""
    literal = s.literal
    return [
        f"({literal(i)}, {literal(t)}, 'pending', {literal(c)}, {literal(r)}, {literal(u)}, "
        f"{literal(a)}, {literal(p)}, '{{}}', {pr:d}, {mr:d}, {literal(k)}, {literal(al)}, "
        f"{literal(pa)}, {literal(us)}, {w:d})"
        for i, t, c, r, u, a, p, pr, mr, k, al, pa, us, w in rows
    ]


def _claim_branches(
    request: ClaimRequest, suspended: Sequence[SuspensionScope]
) -> list[tuple[str, list[Any]]]:
    """One locking SELECT per handler key that may claim (see
    :func:`~taskmill_mysql.statements.claim_select`): a key whose whole scope is
    suspended is left out, apps suspended one by one (and apps with a key of their own)
    are excluded from a host key."""
    limit = request.limit
    own_keys: dict[str, list[str]] = {}
    for app_id, task_type in request.handlers:
        if app_id is not None:
            own_keys.setdefault(task_type, []).append(app_id)
    min_priority = request.min_priority
    branches: list[tuple[str, list[Any]]] = []
    for (app_id, task_type), cap in request.handlers.items():
        take = limit if cap is None else min(cap, limit)
        if take <= 0:
            continue
        if any(scope.covers(app_id, task_type) for scope in suspended):
            continue
        args: list[Any] = [task_type]
        if app_id is not None:
            text = sql.claim_select(True, 0, min_priority is not None)
            args.append(app_id)
        else:
            apps = dict.fromkeys(own_keys.get(task_type, ()))
            for scope in suspended:
                if scope.app_id is not None and scope.task_type in (None, task_type):
                    apps[scope.app_id] = None
            text = sql.claim_select(False, len(apps), min_priority is not None)
            args += apps
        args.append(None)  # now, filled in by claim()
        if min_priority is not None:
            args.append(int(min_priority))
        args.append(take)
        branches.append((text, args))
    return branches


async def claim(s: Session, request: ClaimRequest) -> list[Task]:
    prelude = await s.fetchall(sql.CLAIM_PRELUDE)
    at = prelude[0][0]
    suspended = [
        SuspensionScope(task_type=t, app_id=a) for _, stored, t, a in prelude if stored is not None
    ]
    limited = None
    if request.limits:
        limited = await apply_limits(s, request, at)
        request = limited.request
    picked: list[Row] = []
    for text, args in _claim_branches(request, suspended):
        args[args.index(None, 1)] = at
        picked += await _snapshots(s, text, args)
    if not picked:
        return []
    # Claim order (priority DESC, then creation) across the keys; what a key locked
    # beyond the limit stays as it is (locked until the commit, not updated).
    picked.sort(key=lambda r: (-r[PRIORITY], r[SEQ]))
    del picked[request.limit :]
    lease = at + timedelta(seconds=request.lease_seconds)
    s.defer(
        sql.CLAIM_UPDATE.format(sql.seq_list(r[SEQ] for r in picked)),
        [request.worker_id, at, at, lease],
    )
    rows = [claimed_row(r, request.worker_id, at, lease) for r in picked]
    snapshots = [task(r) for r in rows]
    await append_events(
        s, [(r[SEQ], r[ID], _STARTED, "running", at) for r in sorted(rows, key=_seq_of)]
    )
    if limited is not None:
        await spend_tokens(s, limited, snapshots)
    return snapshots


def _seq_of(row: Row) -> int:
    seq: int = row[SEQ]
    return seq


async def _lock_running(s: Session, ids: Sequence[str]) -> dict[str, Row]:
    """The RUNNING rows among ``ids`` (seq, id, worker_id, attempts, cancel_reason),
    locked, by id."""
    found: dict[str, Row] = {}
    for chunk in _chunks(list(dict.fromkeys(ids))):
        for row in await s.fetchall(sql.LOCK_RUNNING.format(sql.marks(len(chunk))), chunk):
            found[row[1]] = row
    return found


def _held(row: Row | None, lease: Lease) -> bool:
    return row is not None and row[2] == lease.worker_id and row[3] == lease.attempt


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
        f"{literal(as_stored(finish.finished_at))}, {_QUOTED[outcome]}, "
        f"{'NULL' if error is None else literal(error)})"
    )


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
    ended: list[tuple[str, str]] = []
    lock = sql.LOCK_FINISHING if snapshots else sql.LOCK_FINISHING_FENCE
    fence = SNAPSHOT_FENCE if snapshots else NARROW_FENCE
    i_seq, i_id, i_worker, i_attempts = fence.seq, fence.id, fence.worker_id, fence.attempts
    for indexes in finish_rounds(finishes):
        locked: dict[str, Row] = {}
        for chunk in _chunks(list(dict.fromkeys(finishes[i].lease.task_id for i in indexes))):
            text = lock.format(sql.marks(len(chunk)))
            if snapshots:
                found = await _snapshots(s, text, chunk)
            else:
                found = [fence_from_json(r) for r in await s.fetchall(text, chunk)]
            for row in found:
                locked[row[i_id]] = row
                if at is None:
                    at = row[-1]  # the store clock, read with the locks
        if at is None:
            continue  # nothing held: nothing to write
        applied: dict[int, tuple[Row, FinishKind]] = {}
        by_kind: dict[FinishKind, list[list[Any]]] = {}
        for index in indexes:
            one = finishes[index]
            held = locked.get(one.lease.task_id)
            if held is None or held[i_worker] != one.lease.worker_id:
                continue
            if held[i_attempts] != one.lease.attempt:
                continue
            stop_requested = held[fence.cancel_reason] is not None
            kind = finish_kind(one.kind, stop_requested=stop_requested)
            by_kind.setdefault(kind, []).append(_finish_literals(literal, one, held[i_seq], at))
            applied[index] = (held, kind)
        for kind, rows in by_kind.items():
            _apply_finishes(s, at, kind, rows)
        for index, (row, kind) in applied.items():
            one = finishes[index]
            after = _finished(task(row), one, kind, at) if snapshots else None
            seq = row[i_seq]
            task_id = one.lease.task_id
            status = FINISHES[kind].status
            kind_event, outcome = _APPLIED[kind]
            outcome = outcome or one.outcome.value
            events.append((seq, task_id, kind_event, status.value, at))
            if status.terminal:
                ended.append((task_id, status.value))
            if settles_aliases(status, row[fence.dedupe_key], row[fence.alias_of]):
                (stored,) = await _by_seq(s, [seq])  # the leader as stored, for its aliases
                for alias in await _settle_aliases(s, stored, at, events):
                    ended.append((alias[ID], alias[STATUS_COL]))
            log.append(_attempt_literals(literal, seq, one.lease, one, outcome))
            results[index] = after
    if at is None:
        return results
    if ended:
        await settle_dependents(s, ended, at, events)
    if log:
        s.defer_values(sql.INSERT_ATTEMPTS, log)
    await append_events(s, events)
    return results


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
    for chunk in _chunks(seqs):
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
    rows = {r[SEQ]: r for r in await _by_seq(s, list(transitions))}
    rescued: list[Task] = []
    log: list[Row] = []
    events: list[Event] = []
    ended: list[tuple[str, str]] = []
    for seq, task_id, worker_id, attempts, _, started_at, _ in expired:
        row = rows[seq]
        transition = transitions[seq]
        events.append((seq, task_id, transition.event.value, row[STATUS_COL], at))
        if row[STATUS_COL] in _TERMINAL:
            ended.append((task_id, row[STATUS_COL]))
        if leads_aliases(row):
            for alias in await _settle_aliases(s, row, at, events):
                ended.append((alias[ID], alias[STATUS_COL]))
        log.append(
            (
                seq, task_id, attempts, worker_id or "", at if started_at is None else started_at,
                at, _outcome(transition), RESCUE_ERROR,
            )
        )  # fmt: skip
        rescued.append(task(row))
    if ended:
        await settle_dependents(s, ended, at, events)
    await s.executemany(sql.INSERT_ATTEMPT, log)
    await append_events(s, events)
    return rescued


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
    (row,) = await _by_seq(s, [seq])
    await append_events(s, [(seq, task_id, REDRIVE_EVENT.value, "pending", at)])
    return task(row)


# -- reading -------------------------------------------------------------------------------


async def get(s: Session, task_id: str) -> Task | None:
    row = await s.fetchone(sql.SELECT_TASK, (task_id,))
    return None if row is None else task(row)


async def query(s: Session, args: tuple[TaskFilter, int, int, bool, str | None]) -> list[Task]:
    filter, limit, offset, newest_first, after = args
    selected = sql.filter_sql(filter)
    order = "DESC" if newest_first else "ASC"
    clauses = list(selected.clauses)
    values = list(selected.args)
    if after is not None:
        clauses.append(f"seq {'<' if newest_first else '>'} (SELECT seq FROM tasks WHERE id = %s)")
        values.append(after)
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    text = f"SELECT {TASK_COLUMNS} FROM tasks{where} ORDER BY seq {order} LIMIT %s OFFSET %s"
    return [task(r) for r in await s.fetchall(text, [*values, limit, offset])]


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


# -- control -------------------------------------------------------------------------------


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
        for chunk in _chunks(level):
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
    for chunk in _chunks(ids):
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
        for chunk in _chunks(seqs):
            s.defer(
                "UPDATE tasks SET cancel_reason = %s, updated_at = %s "
                f"WHERE seq IN ({sql.marks(len(chunk))})",
                [reason.value, at, *chunk],
            )
        by_id = {r[ID]: r for r in await _by_seq(s, seqs)}
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
    for chunk in _chunks(direct):
        named = ", ".join(f"%(s{i})s" for i in range(len(chunk)))
        s.defer(
            f"UPDATE tasks SET {sql.CANCELLATION_SET}, updated_at = %(now)s, "
            f"{sql.LEASE_CLEARED} WHERE seq IN ({named})",
            {"now": at, "reason": reason.value, **{f"s{i}": q for i, q in enumerate(chunk)}},
        )
    rows = {r[ID]: r for r in await _by_seq(s, direct)}
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
            for alias in await _settle_aliases(s, row, at, events):
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


async def watch(s: Session, leases: Sequence[Lease]) -> dict[str, CancelReason | None]:
    found: dict[str, Row] = {}
    for chunk in _chunks([x.task_id for x in leases]):
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
    for chunk in _chunks([r[0] for r in asked]):
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


async def read_events(s: Session, args: tuple[str | None, int]) -> tuple[list[TaskEvent], str]:
    after, limit = args
    if after is None:
        last = await s.fetchone(sql.EVENT_CURSOR)
        return [], position_token(0 if last is None else int(last[0]))
    position = token_position(after)
    if limit <= 0:
        return [], after
    rows = await s.fetchall(sql.READ_EVENTS, (position, limit))
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


async def prune_events(s: Session, older_than: timedelta) -> int:
    cutoff = await now(s) - older_than
    # Seqs are drawn under the cursor lock, so `at` only grows with seq: the events to
    # delete are the prefix of the log before the first young one.
    first_young = await s.fetchone(sql.FIRST_YOUNG_EVENT, (cutoff,))
    if first_young is None:
        return await s.execute("DELETE FROM events WHERE at < %s", (cutoff,))
    return await s.execute("DELETE FROM events WHERE seq < %s", (first_young[0],))


# -- handler registrations -------------------------------------------------------------------

_REGISTRATION_COLUMNS: Final = (
    "app_id, task_type, url, timeout, max_retries, concurrency, updated_at"
)


async def put_registration(s: Session, r: HandlerRegistration) -> HandlerRegistration:
    at = await now(s)
    await s.execute(
        f"INSERT INTO handler_registrations ({_REGISTRATION_COLUMNS}) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE url = VALUES(url), "
        "timeout = VALUES(timeout), max_retries = VALUES(max_retries), "
        "concurrency = VALUES(concurrency), updated_at = VALUES(updated_at)",
        (r.app_id, r.task_type, r.url, r.timeout, r.max_retries, r.concurrency, at),
    )
    return _registration(
        (r.app_id, r.task_type, r.url, r.timeout, r.max_retries, r.concurrency, at)
    )


async def delete_registration(s: Session, key: tuple[str | None, str]) -> bool:
    return (
        await s.execute(
            "DELETE FROM handler_registrations WHERE app_id <=> %s AND task_type = %s", key
        )
        > 0
    )


async def registrations(s: Session, _: None) -> list[HandlerRegistration]:
    rows = await s.fetchall(
        f"SELECT {_REGISTRATION_COLUMNS} FROM handler_registrations "
        "ORDER BY app_id IS NOT NULL, app_id, task_type"
    )
    return [_registration(r) for r in rows]


def _registration(row: Row) -> HandlerRegistration:
    app_id, task_type, url, timeout, max_retries, concurrency, updated_at = row
    return HandlerRegistration(
        app_id=app_id,
        task_type=task_type,
        url=url,
        timeout=timeout,
        max_retries=max_retries,
        concurrency=concurrency,
        updated_at=as_datetime(updated_at),
    )
