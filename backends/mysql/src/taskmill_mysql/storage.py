"""``mysql://`` (``mariadb://``) — task storage in a MySQL 8+ or MariaDB 10.6+
database, shared by any number of worker processes on any number of machines.

Design (docs/backends/mysql.md has the reasoning and the plans):

- An aiomysql pool per storage object (:mod:`taskmill_mysql.connection`); each write is
  one short ``READ COMMITTED`` transaction, retried after a deadlock or lock wait
  timeout; reads run on their own.
- No ``UPDATE ... RETURNING``: a claim is ``SELECT ... FOR UPDATE SKIP LOCKED`` over
  the ``tasks_claim`` index, an ``UPDATE`` by seq, and a read back, in one transaction
  (:mod:`taskmill_mysql.claims`). Concurrent claimers skip each other's rows.
- No partial indexes: generated columns hold the claim queue and the active dedupe
  leaders (0001_initial.sql); the unique ``dedupe_leader`` index allows one active
  leader per key whatever races between processes.
- Events get their seqs from a row-locked counter held to the commit, so cursors follow
  commit order (AUTO_INCREMENT does not).
- No LISTEN/NOTIFY: workers and event readers poll (``notifications`` is False).
- The server clock (``NOW(6)``, UTC) is the store clock.
- The server's ``max_allowed_packet``, read at ``open``, bounds every packet sent
  (bulk writes are cut to fit, :mod:`taskmill_mysql.packets`) and sets the store's
  ``max_value_bytes``; a statement the server still refuses as too large is
  :class:`~taskmill.errors.InvalidParams`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, Self, TypeVar

import attrs
import pymysql
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

from taskmill_mysql import operations, schema
from taskmill_mysql.connection import DUPLICATE_KEY, Database, Session, error_code
from taskmill_mysql.options import parse_url, redact
from taskmill_mysql.packets import value_ceiling

__all__ = ["MySQLStorage"]

T = TypeVar("T")
A = TypeVar("A")
_DEDUPE_RACES: Final = 8
_DUPLICATE_IN: Final = re.compile(r"for key '(?:tasks\.)?(\w+)'$")
"""The unique index a duplicate-key message ends with: MariaDB writes ``'tasks_id'``,
MySQL 8 ``'tasks.tasks_id'`` (the refused value, before it, may hold anything)."""


class MySQLStorage(TaskStorage):
    """Task storage in one MySQL / MariaDB database, shared by workers on many machines.

    Guarantees, beyond :class:`~taskmill.storage.TaskStorage`'s:

    - Concurrent claims skip each other's rows (``FOR UPDATE SKIP LOCKED``) and never
      return a task twice.
    - One active dedupe leader per key, enforced by a unique index.
    - Event cursors follow commit order.
    - It never modifies a database that holds tables but no taskmill schema.

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

    def __init__(self, url: str, **options: Any) -> None:
        self.url = url
        self._parsed = parse_url(url, options)
        self.options = self._parsed.options
        self.database = self._parsed.database
        self._db = Database(self._parsed, url)
        self._opening = asyncio.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Build a storage for ``mysql://user:password@host:port/database`` (or
        ``mariadb://``) without connecting.

        Options, as keyword arguments or in the query string (keywords win):
        ``pool_min_size`` (1), ``pool_max_size`` (10), ``connect_timeout`` (seconds,
        10), ``lock_wait_timeout`` (seconds, 10) and ``charset`` (utf8mb4).

        :raises InvalidURL: the URL is malformed, or an option is unknown or invalid
            (the message lists the valid ones).
        """
        return cls(url, **options)

    def __repr__(self) -> str:
        return f"MySQLStorage({redact(self.url)!r})"

    @property
    def where(self) -> str:
        """Where the storage points, for messages: never the password."""
        return self._db.where

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self, *, auto_migrate: bool = False) -> None:
        """Check the schema and open the pool.

        A missing or empty database gets the current schema. An older schema is
        migrated only with ``auto_migrate``. Opening an open storage does nothing.
        The server's ``max_allowed_packet`` sets this store's
        ``capabilities.max_value_bytes``
        (:func:`~taskmill_mysql.packets.value_ceiling`).

        :raises SchemaVersionError: the stored schema is older (without
            ``auto_migrate``; the message names ``taskmill migrate --url ...``) or newer
            than this code.
        :raises StorageUnavailable: the server cannot be reached or refused the login
            (the message says what to check, never showing the password), or the
            database holds someone else's tables.
        """
        async with self._opening:
            if self._db.started:
                return
            conn = await self._db.connect()
            try:
                version = await schema.check(
                    conn, self.database, self.where, redact(self.url),
                    auto_migrate=auto_migrate, mariadb=self._db.mariadb,
                )  # fmt: skip
                if version < schema.latest_version():
                    await schema.apply_pending(
                        conn, self.database, self.where, mariadb=self._db.mariadb
                    )
            except (pymysql.err.MySQLError, OSError) as exc:
                raise self._db.unavailable(exc, "prepare") from exc
            finally:
                conn.close()
            await self._db.start()
            # Per instance, shadowing the class's declaration: the core reads
            # ``storage.capabilities`` from the store object.
            vars(self)["capabilities"] = attrs.evolve(
                type(self).capabilities, max_value_bytes=value_ceiling(self._db.packet)
            )

    async def close(self) -> None:
        """Close the pool's connections. Safe to call twice; operations called
        afterwards raise :class:`StorageUnavailable`."""
        await self._db.stop()

    async def exists(self) -> bool:
        """Whether the database holds tables (taskmill's or, for :meth:`open` to refuse,
        someone else's); connects once, creates nothing."""
        conn = await self._db.connect()
        try:
            return bool(await schema.schema_tables(conn, self.database))
        except (pymysql.err.MySQLError, OSError) as exc:
            raise self._db.unavailable(exc, "inspect") from exc
        finally:
            conn.close()

    async def migrate(self) -> int:
        """Apply pending migrations under ``GET_LOCK`` and return the schema version now
        in place; creates the database when missing. Works on an open or a closed
        storage. Idempotent, and safe when several processes run it at once.

        :raises SchemaVersionError: the stored schema is newer than this code.
        :raises StorageUnavailable: the server cannot be reached, or the database holds
            someone else's tables.
        """
        conn = await self._db.connect()
        try:
            return await schema.apply_pending(
                conn, self.database, self.where, mariadb=self._db.mariadb
            )
        except (pymysql.err.MySQLError, OSError) as exc:
            raise self._db.unavailable(exc, "migrate") from exc
        finally:
            conn.close()

    def _write(self, fn: Callable[[Session, A], Awaitable[T]], arg: A) -> Awaitable[T]:
        return self._db.run(lambda s: fn(s, arg))

    def _read(self, fn: Callable[[Session, A], Awaitable[T]], arg: A) -> Awaitable[T]:
        return self._db.run(lambda s: fn(s, arg), transaction=False)

    # -- writing tasks -----------------------------------------------------------------

    async def enqueue(self, tasks: Sequence[NewTask]) -> list[Task]:
        """Insert ``tasks`` in one transaction (all or none). A dedupe key's leader is
        looked up under a share lock; an enqueue that loses the race for a new leader
        (the unique ``dedupe_leader`` index refuses its row) is run again and becomes
        an alias. Ids already stored follow the duplicate-id rule
        (:func:`~taskmill.lifecycle.split_taken`): a stored id (or one committed
        concurrently) makes the unique ``tasks_id`` index refuse the row, and the run
        again, which reads the stored tasks among its ids first, returns that task.

        :returns: the stored snapshots, in the order given.
        """
        if not tasks:
            return []
        # Ids are looked up only once the unique index has refused one (or when the
        # call names an id twice): a bulk enqueue of new ids reads nothing first.
        look_up_ids = len({new.id for new in tasks}) < len(tasks)
        for race in range(_DEDUPE_RACES):
            try:
                return await self._write(operations.enqueue, (tasks, look_up_ids))
            except pymysql.err.IntegrityError as exc:
                refused_by = _DUPLICATE_IN.search(str(exc.args[-1]))
                index = refused_by.group(1) if refused_by else None
                taken_id = index == "tasks_id"
                lost_race = error_code(exc) == DUPLICATE_KEY and (
                    index == "tasks_dedupe_leader" or taken_id
                )
                if not lost_race or race == _DEDUPE_RACES - 1:
                    raise self._db.unavailable(exc) from exc
                look_up_ids = look_up_ids or taken_id
        raise AssertionError("unreachable")

    async def claim_batch(self, request: ClaimRequest) -> list[Task]:
        """Claim up to ``request.limit`` due PENDING leaders: per handler key a
        ``SELECT ... FOR UPDATE SKIP LOCKED`` over ``tasks_claim``, then one ``UPDATE``
        and a read back, in one transaction.

        :returns: the claimed snapshots in claim order (priority DESC, then creation).
        """
        if request.limit <= 0 or not request.handlers:
            return []
        return await self._write(operations.claim, request)

    async def finish_batch(self, finishes: Sequence[Finish]) -> list[Task | None]:
        """Apply many attempt ends in one transaction, each fenced by (id, RUNNING,
        worker id, attempt) on the locked row; a lost lease yields None. A finish with
        ``delete`` that ends its task then moves it and the aliases it settled to
        ``tombstones`` (with their execution logs deleted) in that transaction."""
        if not finishes:
            return []
        return await self._write(operations.finish, finishes)

    async def finish_batch_applied(self, finishes: Sequence[Finish]) -> list[bool]:
        """:meth:`finish_batch` without the snapshots: the same changes in one
        transaction, and per finish whether it was applied. The locking read takes
        only the fence and alias columns, and no snapshot is built."""
        if not finishes:
            return []
        return await self._write(operations.finish_applied, finishes)

    async def renew_leases(
        self, leases: Sequence[Lease], lease_seconds: float
    ) -> dict[str, CancelReason | None]:
        """Extend the leases that still hold (from the server clock); map each to its
        requested cancel reason."""
        if not leases:
            return {}
        return await self._write(operations.renew, (leases, lease_seconds))

    async def save_progress(self, updates: Sequence[ProgressUpdate]) -> set[str]:
        """Write progress/data of running tasks whose lease still holds."""
        if not updates:
            return set()
        return await self._write(operations.save_progress, updates)

    async def rescue_expired(self, *, limit: int = 1000) -> list[Task]:
        """Take back RUNNING tasks whose lease expired by the server clock; rows another
        rescuer holds are skipped, so each is rescued once."""
        if limit <= 0:
            return []
        return await self._write(operations.rescue, limit)

    async def retry(self, task_id: str) -> Task:
        """Redrive a FAILED or CANCELLED leader to PENDING with a fresh budget.

        :raises TaskNotFound: no such task.
        :raises InvalidTransition: the task is active, an alias, or another leader is
            active for its dedupe key.
        """
        return await self._write(operations.redrive, task_id)

    # -- reading -----------------------------------------------------------------------

    async def get(self, task_id: str) -> Task | None:
        """The current snapshot of one task, or None."""
        return await self._read(operations.get, task_id)

    async def deleted_task(self, task_id: str) -> Task | None:
        """The tombstone of a task its finish deleted (``Finish.delete``): its last
        snapshot, kept in ``tombstones`` until :meth:`prune_events` removes events of
        its age; None otherwise. One lookup by the unique ``tombstones_id`` index."""
        return await self._read(operations.deleted_task, task_id)

    async def query(
        self,
        filter: TaskFilter,
        *,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
        after: str | None = None,
    ) -> list[Task]:
        """Tasks selected by ``filter`` in creation order (``seq``), paged in SQL; ``after``
        starts right after that task's place (keyset paging)."""
        if limit <= 0:
            return []
        return await self._read(
            operations.query, (filter, limit, max(offset, 0), newest_first, after)
        )

    async def summary(self, filter: TaskFilter) -> ProgressSummary:
        """Counts by status from one ``GROUP BY status`` query."""
        return await self._read(operations.summary, filter)

    async def attempts(self, task_id: str) -> list[Attempt]:
        """The execution log of one task in insertion order (empty for an unknown id)."""
        return await self._read(operations.attempts, task_id)

    async def next_run_at(self, handlers: Sequence[HandlerKey]) -> datetime | None:
        """The earliest ``run_at`` of a claimable PENDING leader for ``handlers``."""
        if not handlers:
            return None
        return await self._read(operations.next_run_at, handlers)

    # -- retention ---------------------------------------------------------------------

    async def cleanup(
        self,
        older_than: timedelta,
        *,
        statuses: frozenset[TaskStatus] = frozenset({TaskStatus.COMPLETED, TaskStatus.CANCELLED}),
    ) -> int:
        """Delete terminal tasks in ``statuses`` that finished more than ``older_than``
        ago, with their execution logs, in one transaction (their events are pruned by
        age; readers skip them).

        :raises ValueError: ``statuses`` includes an active status.
        """
        if any(s.active for s in statuses):
            raise ValueError("cleanup deletes terminal tasks only")
        if not statuses:
            return 0
        return await self._write(operations.cleanup, (older_than, statuses))

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
        tasks selected, their descendants when ``cascade``, and a cancelled leader's
        aliases, in one transaction. See :meth:`TaskStorage.cancel`.

        :raises ValueError: neither ``task_ids`` nor ``filter`` was given.
        """
        if task_ids is None and filter is None:
            raise ValueError("cancel needs task_ids or a filter")
        ids = None if task_ids is None else list(task_ids)
        return await self._write(operations.cancel, (ids, filter, reason, cascade))

    async def watch_leases(self, leases: Sequence[Lease]) -> dict[str, CancelReason | None]:
        """The requested stop (or None) of each lease that still holds; reads only."""
        if not leases:
            return {}
        return await self._read(operations.watch, leases)

    async def suspend(self, scope: SuspensionScope) -> int:
        """Store ``scope`` (idempotent) and ask the running tasks in it to stop, in one
        transaction; every claim reads the stored suspensions.

        :returns: how many running tasks were asked to stop.
        """
        return await self._write(operations.suspend, scope)

    async def resume(self, scope: SuspensionScope) -> bool:
        """Delete exactly ``scope``; whether it was stored."""
        return await self._write(operations.resume, scope)

    async def suspensions(self) -> list[SuspensionScope]:
        """The stored suspensions, sorted by (task type, app id)."""
        return await self._read(operations.suspensions, None)

    async def read_events(
        self, after: str | None, *, limit: int = 1000
    ) -> tuple[list[TaskEvent], str]:
        """Up to ``limit`` events after cursor ``after`` in commit order, each with its
        task's current snapshot; ``after`` None returns the cursor of the last event
        committed. Events of a task its finish deleted carry its tombstone; events of
        tasks deleted by :meth:`cleanup` are skipped. Cursors are the event seq
        written by :func:`taskmill.cursors.position_token`; any other ``after`` raises
        :class:`~taskmill.errors.InvalidCursor`."""
        return await self._read(operations.read_events, (after, limit))

    async def prune_events(self, older_than: timedelta) -> int:
        """Delete the events recorded more than ``older_than`` ago and the tombstones of
        tasks deleted that long ago, in one transaction; how many events."""
        return await self._write(operations.prune_events, older_than)

    # -- the worker registry -----------------------------------------------------------

    async def put_worker(self, worker_id: str, record: str) -> None:
        """Replace the registration of ``worker_id``, its heartbeat the server clock."""
        await self._write(operations.put_worker, (worker_id, record))

    async def workers(self) -> list[StoredWorker]:
        """Every registration, by worker id."""
        return await self._read(operations.workers, None)

    async def remove_worker(self, worker_id: str) -> bool:
        """Delete the registration of ``worker_id``; whether there was one."""
        return await self._write(operations.remove_worker, worker_id)

    async def prune_workers(self, older_than: timedelta) -> int:
        """Delete registrations whose heartbeat is older than ``older_than`` by the
        server clock; how many."""
        return await self._write(operations.prune_workers, older_than)

    # -- handler registrations ---------------------------------------------------------

    async def put_handler_registration(
        self, registration: HandlerRegistration
    ) -> HandlerRegistration:
        """Insert or replace the registration of its (app id, task type)."""
        return await self._write(operations.put_registration, registration)

    async def delete_handler_registration(self, app_id: str | None, task_type: str) -> bool:
        """Delete one registration; whether it existed."""
        return await self._write(operations.delete_registration, (app_id, task_type))

    async def handler_registrations(self) -> list[HandlerRegistration]:
        """Every registration, the host's first, then by app id and task type."""
        return await self._read(operations.registrations, None)
