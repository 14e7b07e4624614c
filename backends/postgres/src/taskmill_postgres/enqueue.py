"""Inserting new tasks: the enqueue statement, the unique indexes that arbitrate races
between concurrent enqueues, and dependencies checked under a share lock.

Dedupe leaders are decided in the statement: a keyed task becomes an alias of its
scope's active leader (share-locked while deciding), else of the first task of its
scope in this call, else it leads. The ``tasks_dedupe_leader`` unique index is the
arbiter: when a concurrent enqueue committed a leader this statement could not see, the
insert fails on that index and the statement runs again, finding that leader. Ids
already stored follow the duplicate-id rule (:func:`~taskmill.lifecycle.split_taken`);
an id committed concurrently makes the insert fail on ``tasks_id_key`` and run again,
returning that task.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Final, NamedTuple, TypeAlias

import asyncpg
from taskmill.errors import DuplicateTaskId, StorageUnavailable
from taskmill.lifecycle import (
    CANCELLATION,
    check_dependencies,
    dependency_blocks,
    dependency_error,
    enqueued_batch,
    split_taken,
)
from taskmill.model import Task
from taskmill.storage import NewTask

from taskmill_postgres import rows
from taskmill_postgres.arguments import enqueue_arguments
from taskmill_postgres.cancellation import settle_aliases
from taskmill_postgres.connection import Record
from taskmill_postgres.events import EventLog, Events
from taskmill_postgres.schema import Conn
from taskmill_postgres.statements import Statements

__all__ = ["Enqueue", "Inserted"]

_CANCELLED: Final = CANCELLATION.event.value
_ROUNDS: Final = 8
"""How many times an enqueue runs again after losing a race on a unique index."""

Edges: TypeAlias = tuple[list[str], list[str], list[bool]]
"""The dependency edges to write: dependency ids, dependent ids, ``after_always``."""


class Inserted(NamedTuple):
    """What one enqueue found and wrote."""

    fresh: list[NewTask]
    """The tasks inserted."""
    known: dict[str, Task]
    """The stored snapshots of the ids that were taken already, by id."""
    row: Record | None
    """The enqueue statement's row (the store clock, the aliases' leaders), or None
    when nothing was inserted."""
    cancelled: dict[str, Record]
    """The rows of the inserted tasks cancelled at once (a dependency ended without
    completing), by id."""

    def snapshots(self, tasks: Sequence[NewTask]) -> list[Task]:
        """The stored snapshot of each of ``tasks``, in that order."""
        known = self.known
        if self.row is not None:
            leaders = dict(zip(self.row[1] or (), self.row[2] or (), strict=True))
            stored = enqueued_batch(self.fresh, now=self.row[0], alias_of=leaders)
            known.update(zip([new.id for new in self.fresh], stored, strict=True))
            for task_id, found in self.cancelled.items():
                known[task_id] = rows.task(found)
        return [known[new.id] for new in tasks]


class Enqueue:
    """The enqueue of one schema."""

    __slots__ = ("log", "sql", "where")

    def __init__(self, sql: Statements, log: EventLog, where: str) -> None:
        self.sql = sql
        self.log = log
        self.where = where

    async def insert(self, conn: Conn, tasks: Sequence[NewTask], depends: bool) -> Inserted:
        """Insert ``tasks`` with one statement, their ENQUEUED events and a ``work``
        notification with them; inside a transaction when ``depends`` (some task has
        dependencies).

        :raises StorageUnavailable: the insert kept losing races to concurrent
            enqueues.
        :raises InvalidTaskSpec: a dependency is missing or another app's.
        """
        wanted = list(dict.fromkeys(new.id for new in tasks))
        keyed = any(new.dedupe_key is not None for new in tasks)
        sql = self.sql.enqueue if keyed else self.sql.enqueue_unkeyed
        for round_ in range(_ROUNDS):
            fresh: list[NewTask] = []
            known: dict[str, Task] = {}
            if round_ == 0:
                # Optimistically, as if none of the ids were stored (fresh ids, the
                # usual case): a stored one makes the insert fail on tasks_id_key,
                # and the next round reads them. One round trip instead of two.
                with contextlib.suppress(DuplicateTaskId):  # decided by the next round
                    fresh, known = split_taken(tasks, {})
            if not fresh:
                found = await conn.fetch(self.sql.by_ids, wanted)
                fresh, known = split_taken(tasks, {r["id"]: rows.task(r) for r in found})
            if not fresh:
                return Inserted(fresh, known, None, {})
            try:
                if depends:
                    async with conn.transaction():  # a savepoint, for the retry
                        row, cancelled = await self._attempt(conn, sql, fresh, depends)
                else:
                    row, cancelled = await self._attempt(conn, sql, fresh, depends)
            except asyncpg.exceptions.UniqueViolationError as exc:
                if exc.constraint_name in ("tasks_dedupe_leader", "tasks_id_key"):
                    # a leader or one of these ids committed meanwhile: run again,
                    # as its alias or returning that task
                    continue
                raise
            return Inserted(fresh, known, row, cancelled)
        raise StorageUnavailable(
            f"enqueueing on {self.where} kept racing concurrent enqueues of the same"
            " dedupe keys or task ids"
        )

    async def _attempt(
        self, conn: Conn, sql: str, fresh: list[NewTask], depends: bool
    ) -> tuple[Record, dict[str, Record]]:
        waiting = [0] * len(fresh)
        edges: Edges = ([], [], [])
        blocked: dict[int, str] = {}
        if depends:
            blocked = await self._dependencies(conn, fresh, waiting, edges)
        row = await conn.fetchrow(
            sql, *enqueue_arguments(fresh, waiting, self.log.lock, self.log.channel)
        )
        assert row is not None  # an aggregate: always one row
        if edges[0]:
            await conn.execute(self.sql.insert_dependencies, *edges)
        cancelled: dict[str, Record] = {}
        if blocked:
            events = Events()
            # The batch is stored; then what a dependency blocks is cancelled in order, a
            # blocked leader settling its aliases (a blocked alias it settled is skipped).
            for index, error in blocked.items():
                found = await conn.fetchrow(self.sql.cancel_for_dependency, fresh[index].id, error)
                if found is None:
                    continue  # an alias its blocked leader settled just before
                cancelled[fresh[index].id] = found
                events.add(found[rows.SEQ], _CANCELLED, "cancelled")
                if found[rows.DEDUPE_KEY] is None or found[rows.ALIAS_OF] is not None:
                    continue  # leads no aliases
                aliases = await settle_aliases(conn, self.sql, [found])
                for alias in aliases.get(found[rows.SEQ], ()):
                    cancelled[alias[rows.ID]] = alias
                    events.add(alias[rows.SEQ], _CANCELLED, "cancelled")
            await self.log.append(conn, events)
        return row, cancelled

    async def _dependencies(
        self,
        conn: Conn,
        tasks: Sequence[NewTask],
        waiting: list[int],
        edges: Edges,
    ) -> dict[int, str]:
        """Read (share-locked) and check the dependencies of ``tasks``; fill in each
        task's count of unfinished ones (``waiting``) and the edges to write.

        :returns: by task index, the error of the tasks to cancel at once (a dependency
            already ended without completing).
        :raises InvalidTaskSpec: a dependency is missing or another app's.
        """
        wanted = list(dict.fromkeys(d for new in tasks for d in new.after))
        found = {r[0]: (r[1], r[2]) for r in await conn.fetch(self.sql.lock_dependencies, wanted)}
        check_dependencies(tasks, {task_id: app_id for task_id, (_, app_id) in found.items()})
        blocked: dict[int, str] = {}
        for index, new in enumerate(tasks):
            for dependency in new.after:
                status = found[dependency][0]
                blocks = dependency_blocks(rows.STATUS[status], new.after_always)
                if blocks is None:
                    waiting[index] += 1
                    edges[0].append(dependency)
                    edges[1].append(new.id)
                    edges[2].append(new.after_always)
                elif blocks and index not in blocked:
                    blocked[index] = dependency_error(dependency, rows.STATUS[status])
        return blocked
