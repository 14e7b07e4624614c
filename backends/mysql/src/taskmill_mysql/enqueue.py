"""Inserting new tasks: dedupe leaders, dependencies checked under a share lock, the
multi-row ``INSERT`` cut to fit a packet, and the seqs it stored read back.

A keyed task becomes an alias of its scope's active leader (looked up under a share
lock), else of the first task of its scope in this call, else it leads. The unique
``tasks_dedupe_leader`` index is the arbiter: when a concurrent enqueue committed a
leader this one could not see, the insert fails on that index and
:meth:`~taskmill_mysql.storage.MySQLStorage.enqueue` runs it again, finding that
leader. Ids already stored follow the duplicate-id rule
(:func:`~taskmill.lifecycle.split_taken`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from taskmill.lifecycle import (
    DEPENDENCY_CANCELLATION,
    check_dependencies,
    dependency_blocks,
    dependency_error,
    enqueued,
    split_taken,
)
from taskmill.model import EventKind, Task
from taskmill.settlement import Settlement
from taskmill.sql.rows import STATUS
from taskmill.storage import NewTask

from taskmill_mysql import statements as sql
from taskmill_mysql.connection import Session
from taskmill_mysql.events import Event, Inserted, append_events
from taskmill_mysql.ledger import MySQLLedger, Ref
from taskmill_mysql.packets import chunks
from taskmill_mysql.readback import now
from taskmill_mysql.rows import as_datetime, as_stored, task

__all__ = ["enqueue"]

_ENQUEUED: Final = EventKind.ENQUEUED.value


async def _dependencies(s: Session, tasks: Sequence[NewTask]) -> dict[str, tuple[str, str | None]]:
    """The (status, app id) of every task ``tasks`` depend on, share-locked; refuses a
    dependency that does not exist or is another app's (before anything is written)."""
    wanted = list(dict.fromkeys(d for new in tasks for d in new.after))
    found: dict[str, tuple[str, str | None]] = {}
    for chunk in chunks(wanted):
        for task_id, status, app_id in await s.fetchall(sql.lock_dependencies(len(chunk)), chunk):
            found[task_id] = (status, app_id)
    check_dependencies(tasks, {task_id: app_id for task_id, (_, app_id) in found.items()})
    return found


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
    for chunk in chunks(ids):
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
    known.update((t.id, t) for t in stored)
    if blocked:
        ledger = MySQLLedger(s, at, events)
        settlement = Settlement(ledger)
        changed: list[Ref] = []
        for index, (dependency, status) in blocked.items():
            error = dependency_error(dependency, STATUS[status])
            ref = await ledger.cancel_waiting(seq_of[fresh[index].id], error)
            if ref is None:
                continue  # an alias its blocked leader settled just before
            changed.append(ref)
            changed += await settlement.transitioned(ref, DEPENDENCY_CANCELLATION.event)
        changed += await settlement.dependents()
        for ref in changed:
            known[ref.id] = task(await ref.stored(s))
    await append_events(s, events, enqueued=ranges or (), at=at)
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
