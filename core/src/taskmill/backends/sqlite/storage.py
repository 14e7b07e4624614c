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

The package is split along those seams: :mod:`~taskmill.backends.sqlite.options` (the
URL), :mod:`~taskmill.backends.sqlite.rows` (values and snapshots),
:mod:`~taskmill.backends.sqlite.statements` (the SQL, generated from the lifecycle
kernel), :mod:`~taskmill.backends.sqlite.schema` (migrations),
:mod:`~taskmill.backends.sqlite.connection` (the thread and the file),
:mod:`~taskmill.backends.sqlite.operations` (one function per operation) and this
module, the :class:`~taskmill.storage.TaskStorage` they make up.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Self

from taskmill.backends.sqlite import operations, registrations
from taskmill.backends.sqlite.connection import SQLiteDatabase
from taskmill.backends.sqlite.options import SQLiteOptions, parse_url
from taskmill.backends.sqlite.statements import claim_statement
from taskmill.model import (
    Attempt,
    CancelReason,
    ProgressSummary,
    SuspensionScope,
    Task,
    TaskEvent,
    TaskFilter,
    TaskStatus,
)
from taskmill.storage import (
    ClaimRequest,
    Finish,
    HandlerKey,
    HandlerRegistration,
    Lease,
    NewTask,
    ProgressUpdate,
    StorageCapabilities,
    StoredWorker,
    TaskStorage,
)

__all__ = ["SQLiteStorage", "claim_statement"]


class SQLiteStorage(SQLiteDatabase, TaskStorage):
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
        worker_registry=True,
    )

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Build a storage for ``sqlite:///relative/path.db`` (relative to the current
        directory) or ``sqlite:////absolute/path.db`` without touching the file.

        Options, as keyword arguments or in the query string (keywords win):
        ``busy_timeout`` (seconds, default 30) and ``synchronous`` (default NORMAL).

        :raises InvalidURL: the URL has no path or a host, or an option is unknown or
            invalid (the message lists the valid ones).
        """
        path, from_query = parse_url(url)
        parsed = SQLiteOptions.parse({**from_query, **options})
        return cls(path, url=url, busy_timeout=parsed.busy_timeout, synchronous=parsed.synchronous)

    def __repr__(self) -> str:
        return f"SQLiteStorage({self.url!r})"

    # -- writing tasks -----------------------------------------------------------------

    async def enqueue(self, tasks: Sequence[NewTask]) -> list[Task]:
        """Insert ``tasks`` in one transaction (all or none), deciding dedupe leaders
        under the writer lock; the ``tasks_dedupe_leader`` unique index backs this up.

        :returns: the stored snapshots, in the order given.
        """
        if not tasks:
            return []
        return await self._run(self._write, operations.enqueue, tasks)

    async def claim_batch(self, request: ClaimRequest) -> list[Task]:
        """Claim up to ``request.limit`` due PENDING leaders with one ``UPDATE ...
        RETURNING`` under the writer lock; see :func:`claim_statement`.

        :returns: the claimed snapshots in claim order (priority DESC, then creation).
        """
        if request.limit <= 0 or not request.handlers:
            return []
        return await self._run(self._write, operations.claim, request)

    async def finish_batch(self, finishes: Sequence[Finish]) -> list[Task | None]:
        """Apply many attempt ends in one transaction, each fenced by (id, RUNNING,
        worker id, attempt); a lost lease yields None and writes nothing."""
        if not finishes:
            return []
        return await self._run(self._write, operations.finish, finishes)

    async def finish_batch_applied(self, finishes: Sequence[Finish]) -> list[bool]:
        """:meth:`finish_batch` without building the snapshots (no plugin observes
        the finishes): the same transaction, and per finish whether it was applied."""
        if not finishes:
            return []
        return await self._run(self._write, operations.finish_applied, finishes)

    async def renew_leases(
        self, leases: Sequence[Lease], lease_seconds: float
    ) -> dict[str, CancelReason | None]:
        """Extend the leases that still hold; map each to its requested cancel reason."""
        if not leases:
            return {}
        return await self._run(self._write, operations.renew, (leases, lease_seconds))

    async def save_progress(self, updates: Sequence[ProgressUpdate]) -> set[str]:
        """Write progress/data of running tasks whose lease still holds."""
        if not updates:
            return set()
        return await self._run(self._write, operations.save_progress, updates)

    async def rescue_expired(self, *, limit: int = 1000) -> list[Task]:
        """Take back RUNNING tasks whose lease expired by the store clock
        (``time.time()``); each is rescued once even when every worker runs this."""
        if limit <= 0:
            return []
        return await self._run(self._write, operations.rescue, limit)

    async def retry(self, task_id: str) -> Task:
        """Redrive a FAILED or CANCELLED leader to PENDING with a fresh budget.

        :raises TaskNotFound: no such task.
        :raises InvalidTransition: the task is active, an alias, or another leader is
            active for its dedupe key.
        """
        return await self._run(self._write, operations.redrive, task_id)

    # -- reading -----------------------------------------------------------------------

    async def get(self, task_id: str) -> Task | None:
        """The current snapshot of one task, or None."""
        return await self._run(self._read, operations.get, task_id)

    async def deleted_task(self, task_id: str) -> Task | None:
        """The tombstone of a task its finish deleted, from one primary-key lookup."""
        return await self._run(self._read, operations.deleted_task, task_id)

    async def query(
        self,
        filter: TaskFilter,
        *,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
        after: str | None = None,
    ) -> list[Task]:
        """Tasks selected by ``filter`` in creation order (``seq``), paged in SQL."""
        if limit <= 0:
            return []
        return await self._run(
            self._read, operations.query, (filter, limit, max(offset, 0), newest_first, after)
        )

    async def summary(self, filter: TaskFilter) -> ProgressSummary:
        """Counts by status from one ``GROUP BY status`` query; no task is loaded."""
        return await self._run(self._read, operations.summary, filter)

    async def attempts(self, task_id: str) -> list[Attempt]:
        """The execution log of one task in insertion order (empty for an unknown id)."""
        return await self._run(self._read, operations.attempts, task_id)

    async def next_run_at(self, handlers: Sequence[HandlerKey]) -> datetime | None:
        """The earliest ``run_at`` of a claimable PENDING leader for ``handlers``."""
        if not handlers:
            return None
        return await self._run(self._read, operations.next_run_at, handlers)

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
        return await self._run(self._write, operations.cleanup, (older_than, statuses))

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
        return await self._run(self._write, operations.cancel, (ids, filter, reason, cascade))

    async def watch_leases(self, leases: Sequence[Lease]) -> dict[str, CancelReason | None]:
        """The requested stop (or None) of each lease that still holds; reads only
        (one ``SELECT`` per 500 leases), fenced like :meth:`renew_leases`."""
        if not leases:
            return {}
        return await self._run(self._read, operations.watch, leases)

    async def suspend(self, scope: SuspensionScope) -> int:
        """Store ``scope`` (idempotent) and ask the running tasks in it to stop, in one
        transaction; claims by every process read the stored suspensions.

        :returns: how many running tasks were asked to stop.
        """
        return await self._run(self._write, operations.suspend, scope)

    async def resume(self, scope: SuspensionScope) -> bool:
        """Delete exactly ``scope``; whether it was stored."""
        return await self._run(self._write, operations.resume, scope)

    async def suspensions(self) -> list[SuspensionScope]:
        """The stored suspensions, sorted by (task type, app id)."""
        return await self._run(self._read, operations.suspensions, None)

    async def read_events(
        self, after: str | None, *, limit: int = 1000
    ) -> tuple[list[TaskEvent], str]:
        """Up to ``limit`` events after cursor ``after`` in seq (commit) order, each
        with its task's current snapshot, from one ``SELECT``; ``after`` None returns the
        cursor of the last event committed. Events of a task a deleting finish removed
        carry its tombstone; those of tasks deleted by cleanup are skipped, and the
        returned cursor moves past them too. Cursors are the seq written by
        :func:`taskmill.cursors.position_token`; any other ``after`` raises
        :class:`~taskmill.errors.InvalidCursor`."""
        return await self._run(self._read, operations.read_events, (after, limit))

    async def prune_events(self, older_than: timedelta) -> int:
        """Delete the events recorded more than ``older_than`` ago, and the tombstones
        as old; how many events."""
        return await self._run(self._write, operations.prune_events, older_than)

    # -- the worker registry -----------------------------------------------------------

    async def put_worker(self, worker_id: str, record: str) -> None:
        """Replace the registration of ``worker_id``, its heartbeat the store clock."""
        await self._run(self._write, operations.put_worker, (worker_id, record))

    async def workers(self) -> list[StoredWorker]:
        """Every registration, by worker id."""
        return await self._run(self._read, operations.workers, None)

    async def remove_worker(self, worker_id: str) -> bool:
        """Delete the registration of ``worker_id``; whether there was one."""
        return await self._run(self._write, operations.remove_worker, worker_id)

    async def prune_workers(self, older_than: timedelta) -> int:
        """Delete registrations whose heartbeat is older than ``older_than``."""
        return await self._run(self._write, operations.prune_workers, older_than)

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
