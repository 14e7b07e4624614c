"""``postgresql://`` — task storage in a PostgreSQL schema, shared by any number of
worker processes on any number of machines.

Design:

- An asyncpg connection pool per storage object (:mod:`taskmill_postgres.connection`).
  Each domain operation takes one connection for its duration; most are one SQL
  statement (one round trip, an implicit transaction), the rest one explicit
  transaction.
- Claims are one ``UPDATE ... WHERE seq = ANY(ARRAY(SELECT ... FOR UPDATE SKIP LOCKED))``
  statement over the partial ``tasks_claim`` index (see
  :meth:`Statements.claim_arguments`): concurrent workers skip each other's rows instead
  of waiting, and no task is returned twice.
- State changes are fenced by (id, RUNNING, worker id, attempt) in their WHERE clause;
  batches of finishes, renewals and progress travel as arrays (``unnest``,
  :mod:`taskmill_postgres.arguments`), one statement per batch.
- Every change appends its events in its own transaction, behind the events lock, so
  event seqs follow commit order (:mod:`taskmill_postgres.events`); the same
  transaction NOTIFYs the schema's channels (see :mod:`taskmill_postgres.listener`).
- Dedupe is enforced by a partial unique index on active leaders; an enqueue that loses
  a race for a leader is retried and becomes an alias (:mod:`taskmill_postgres.enqueue`).
- The database clock (``now()``) is the store clock: every worker on every machine
  agrees on it.
- Delete on finish (``Finish.delete``) is a variant of the finish statement, run only for
  a batch that has a deleting finish; each deleted task's last snapshot is kept in
  ``tombstones`` for the event reader and :meth:`PostgresStorage.deleted_task` (see
  ``Statements._finish_deleting`` and ``migrations/0008_tombstones.sql``).

Each method here runs its statement (:mod:`taskmill_postgres.statements`) on the pool,
or hands a multi-statement transaction to the module of its concern (``enqueue``,
``cancellation``, ``limits``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Final, Self

import asyncpg
import attrs
from taskmill.cursors import position_token, token_position
from taskmill.errors import TaskNotFound
from taskmill.lifecycle import REDRIVE_EVENT, check_redrive, finish_rounds, key_taken
from taskmill.limiting import limit_claim, spend_claimed
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
from taskmill.sql.filters import page_sql, translate
from taskmill.sql.rows import events_of_rows
from taskmill.storage import (
    ChangeListener,
    ClaimRequest,
    Finish,
    HandlerKey,
    HandlerRegistration,
    Lease,
    NewTask,
    ProgressUpdate,
    StorageCapabilities,
    StoreChange,
    StoredWorker,
    TaskStorage,
)

from taskmill_postgres import rows, schema
from taskmill_postgres.arguments import (
    delete_flags,
    finish_arrays,
    lease_arrays,
    progress_arrays,
)
from taskmill_postgres.cancellation import Cancellation
from taskmill_postgres.connection import SEQ_SCANS_ALLOWED, UNAVAILABLE, Database, Record
from taskmill_postgres.enqueue import Enqueue, Inserted
from taskmill_postgres.events import EventLog, Events
from taskmill_postgres.limits import LimitStatements, PostgresBuckets
from taskmill_postgres.listener import PostgresChangeListener
from taskmill_postgres.options import (
    ParsedURL,
    channel_prefix,
    lock_key,
    parse_url,
    redact,
)
from taskmill_postgres.registrations import RegistrationStatements, from_rows, upsert_arguments
from taskmill_postgres.schema import Conn
from taskmill_postgres.statements import DIALECT, TASK_COLUMNS, Statements, filter_sql
from taskmill_postgres.workers import WorkerStatements, deleted, workers_of_rows

__all__ = ["PostgresStorage"]

_CLEANED_BY_DEFAULT: Final = frozenset({TaskStatus.COMPLETED, TaskStatus.CANCELLED})

_finish_arrays = finish_arrays
"""Kept under its old name: tests/test_postgres_plans.py and bench/finish_batch_scaling.py
import it from here."""


class PostgresStorage(TaskStorage):
    """Task storage in one PostgreSQL schema, shared by workers on many machines.

    Guarantees, beyond :class:`~taskmill.storage.TaskStorage`'s:

    - A claim is one statement; concurrent claims skip each other's rows
      (``FOR UPDATE SKIP LOCKED``) and never return a task twice.
    - Committed work is as durable as the server makes it (``synchronous_commit``).
    - Change notifications: :meth:`change_listener` (LISTEN/NOTIFY).
    - It never modifies a schema that holds tables but no taskmill schema.

    Build it with :meth:`from_url`; call :meth:`open` before use and :meth:`close` after.
    """

    capabilities = StorageCapabilities(
        durable=True,
        shared_between_processes=True,
        notifications=True,
        transactions_across_records=True,
        commit_ordered_cursors=True,
        handler_registrations=True,
        worker_registry=True,
    )

    def __init__(self, parsed: ParsedURL, *, url: str) -> None:
        self.url = url
        self._parsed = parsed
        self.options = parsed.options
        self.schema = parsed.options.schema
        self.channel = channel_prefix(self.schema)
        """Changes of kind ``k`` are notified on channel ``channel + k.value``."""
        self.sql = Statements(self.schema)
        self.registration_sql = RegistrationStatements(self.schema)
        self.worker_sql = WorkerStatements(self.schema)
        self.limit_sql = LimitStatements(self.schema)
        self._events_lock = lock_key("events", self.schema)
        self._db = Database(parsed, url)
        self._events = EventLog(self.sql, self._events_lock, self.channel)
        self._enqueue = Enqueue(self.sql, self._events, self._db.where)
        self._cancellation = Cancellation(self.sql, self._events)
        self._opening = asyncio.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Build a storage for ``postgresql://user:password@host:port/database`` (or
        ``postgres://``) without connecting.

        Options, as keyword arguments or in the query string (keywords win): ``schema``
        (default ``taskmill``), ``pool_min_size`` (1), ``pool_max_size`` (10),
        ``statement_timeout`` (seconds, 0 = none), ``connect_timeout`` (10),
        ``command_timeout`` (none) and ``application_name`` (taskmill). libpq
        connection parameters asyncpg understands (``sslmode``, ``host``, ...) may also
        appear in the query string.

        :raises InvalidURL: the URL is malformed, or an option is unknown or invalid
            (the message lists the valid ones).
        """
        return cls(parse_url(url, options), url=url)

    def __repr__(self) -> str:
        return f"PostgresStorage({redact(self.url)!r})"

    @property
    def where(self) -> str:
        """Where the storage points, for messages: never the password."""
        return self._db.where

    @property
    def _pool(self) -> asyncpg.Pool | None:
        """The open pool, or None (tests/test_contract_postgres.py reads it)."""
        return self._db.pool

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self, *, auto_migrate: bool = False) -> None:
        """Connect the pool and check the schema.

        A missing or empty schema gets the current one. An older schema is migrated
        only with ``auto_migrate``. Opening an open storage does nothing.

        :raises SchemaVersionError: the stored schema is older (without
            ``auto_migrate``; the message names ``taskmill migrate --url ...``) or newer
            than this code.
        :raises StorageUnavailable: the server cannot be reached (the message names
            host, port, database and user, never the password), or the schema holds
            someone else's tables.
        """
        async with self._opening:
            if self._db.started:
                return
            await self._db.start(lambda conn: self._check_schema(conn, auto_migrate))

    async def _check_schema(self, conn: Conn, auto_migrate: bool) -> None:
        name = self.schema
        url = redact(self.url)
        version = await schema.check(conn, name, self.where, url, auto_migrate=auto_migrate)
        if version < schema.latest_version():
            await schema.apply_pending(conn, name, self.where)

    async def close(self) -> None:
        """Close the pool's connections. Safe to call twice; operations called
        afterwards raise :class:`StorageUnavailable`."""
        await self._db.stop()

    async def exists(self) -> bool:
        """Whether the schema holds tables (taskmill's or, for :meth:`open` to refuse,
        someone else's); connects once, creates nothing."""
        conn = await self._db.connect()
        try:
            return bool(await schema.schema_tables(conn, self.schema))
        except (*UNAVAILABLE, asyncpg.PostgresError) as exc:
            raise self._db.unavailable(exc, "inspect") from exc
        finally:
            await conn.close()

    async def migrate(self) -> int:
        """Apply pending migrations in one transaction and return the schema version
        now in place; creates the schema when missing. Works on an open or a closed
        storage (``taskmill migrate`` uses the latter on a schema ``open`` refuses).

        Idempotent, and safe when several processes run it at once: each takes
        ``pg_advisory_xact_lock`` keyed by the schema, so the second waits for the
        first and then finds nothing to do.

        :raises SchemaVersionError: the stored schema is newer than this code.
        :raises StorageUnavailable: the server cannot be reached, or the schema holds
            someone else's tables.
        """
        conn = await self._db.connect()
        try:
            return await schema.apply_pending(conn, self.schema, self.where)
        except (*UNAVAILABLE, asyncpg.PostgresError) as exc:
            raise self._db.unavailable(exc, "migrate") from exc
        finally:
            try:
                async with asyncio.timeout(5):
                    await conn.close()
            except (*UNAVAILABLE, asyncpg.PostgresError):
                conn.terminate()

    async def change_listener(self) -> ChangeListener:
        """A listener on this schema's NOTIFY channels, over a dedicated connection that
        reconnects by itself (see :class:`PostgresChangeListener`); the caller closes it.

        :raises StorageUnavailable: the server cannot be reached.
        """
        return await PostgresChangeListener.open(self._db.connect, self.channel)

    # -- writing tasks -------------------------------------------------------------------

    async def enqueue(self, tasks: Sequence[NewTask]) -> list[Task]:
        """Insert ``tasks`` with one statement (all or none), their ENQUEUED events and
        a ``work`` notification with them.

        Concurrent enqueues of one dedupe key yield one leader and aliases, never an
        error; ids already stored, also when committed concurrently, follow the
        duplicate-id rule (:func:`~taskmill.lifecycle.split_taken`). How: see
        :mod:`taskmill_postgres.enqueue`.

        :returns: the stored snapshots, in the order given.
        """
        if not tasks:
            return []
        depends = any(new.after for new in tasks)

        async def insert(conn: Conn) -> Inserted:
            return await self._enqueue.insert(conn, tasks, depends)

        inserted = await self._db.run(insert, transaction=depends)
        return inserted.snapshots(tasks)

    async def claim_batch(self, request: ClaimRequest) -> list[Task]:
        """Claim up to ``request.limit`` due PENDING leaders with one statement, which
        also writes their STARTED events (see :meth:`Statements.claim_arguments`).

        :returns: the claimed snapshots in claim order (priority DESC, then creation).
        """
        if request.limit <= 0 or not request.handlers:
            return []
        if request.limits:
            return await self._db.run(
                lambda conn: self._claim_limited(conn, request), transaction=True
            )
        statement = self.sql.claim_arguments(request, self._events_lock, self.channel)
        if statement is None:
            return []
        sql, args = statement

        async def claim(conn: Conn) -> list[Record]:
            return list(await conn.fetch(sql, *args))

        found = await self._db.run(claim)
        return rows.claim_order(found) if found else []

    async def _claim_limited(self, conn: Conn, request: ClaimRequest) -> list[Task]:
        """A claim under global limits, in one transaction: lock the limited keys'
        ``rate_buckets`` rows, count their RUNNING tasks, claim within what they allow,
        write the spent tokens back (see :mod:`taskmill_postgres.limits`)."""
        ledger = PostgresBuckets(conn, self.limit_sql)
        limited = await limit_claim(ledger, request)
        statement = self.sql.claim_arguments(limited.request, self._events_lock, self.channel)
        if statement is None:
            return []
        sql, args = statement
        found = list(await conn.fetch(sql, *args))
        claimed = rows.claim_order(found) if found else []
        await spend_claimed(ledger, limited, ((t.app_id, t.task_type) for t in claimed))
        return claimed

    async def finish_batch(self, finishes: Sequence[Finish]) -> list[Task | None]:
        """Apply many attempt ends with one statement (see ``Statements.finish``): every
        finish kind at once from arrays, each fenced by (id, RUNNING, worker id,
        attempt), with the execution-log rows, the terminal leaders' aliases, the
        events and the notification. A batch of which some finish deletes its task
        (``Finish.delete``) runs ``Statements.finish_deleting`` instead, which also
        deletes those tasks and writes their tombstones in the same statement.

        A task named twice in one call is finished in call order (the second finds its
        lease gone, as if the calls were made one after the other): one statement per
        such round, in one transaction.
        """
        if not finishes:
            return []
        rounds = finish_rounds(finishes)

        async def apply(conn: Conn) -> list[Task | None]:
            results: list[Task | None] = [None] * len(finishes)
            for indexes in rounds:
                done = await self._finish(conn, finishes, indexes, applied=False)
                for row in done:
                    results[indexes[row["ord"] - 1]] = rows.task(row)
            return results

        return await self._db.run(apply, transaction=len(rounds) > 1)

    async def finish_batch_applied(self, finishes: Sequence[Finish]) -> list[bool]:
        """:meth:`finish_batch` without the snapshots: the same statement, returning
        only which finishes were applied (``Statements.finish_applied``), so no row is
        read back, sent or converted."""
        if not finishes:
            return []
        rounds = finish_rounds(finishes)

        async def apply(conn: Conn) -> list[bool]:
            applied = [False] * len(finishes)
            for indexes in rounds:
                done = await self._finish(conn, finishes, indexes, applied=True)
                for row in done:
                    applied[indexes[row[0] - 1]] = True
            return applied

        return await self._db.run(apply, transaction=len(rounds) > 1)

    async def _finish(
        self, conn: Conn, finishes: Sequence[Finish], indexes: list[int], *, applied: bool
    ) -> list[Record]:
        """Run the finish statement of ``finishes[indexes]``: :attr:`Statements.finish`
        (``finish_applied``), or, when some of them delete their task,
        ``finish_deleting`` (``finish_deleting_applied``), which takes their delete
        flags as one more argument."""
        arrays = finish_arrays(finishes, indexes)
        flags = delete_flags(finishes, indexes)
        sql = self.sql
        if flags is None:
            statement = sql.finish_applied if applied else sql.finish
            found: list[Record] = await conn.fetch(
                statement, *arrays, self._events_lock, self.channel
            )
            return found
        statement = sql.finish_deleting_applied if applied else sql.finish_deleting
        found = await conn.fetch(statement, *arrays, self._events_lock, self.channel, flags)
        return found

    async def renew_leases(
        self, leases: Sequence[Lease], lease_seconds: float
    ) -> dict[str, CancelReason | None]:
        """Extend the leases that still hold with one statement; map each to the stop
        requested for it (recorded, or 'suspended' when its scope is suspended now).

        It never waits for a row lock: a task whose row another transaction holds (its
        own finish being written, a cancel) is left as it is (``SKIP LOCKED``) and
        reported from its committed row: held while that row is RUNNING under this
        lease, though not extended this time."""
        if not leases:
            return {}
        ids, workers, attempts = lease_arrays(leases)

        async def renew(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.sql.renew, ids, workers, attempts, lease_seconds))

        return {
            r[0]: None if r[1] is None else rows.REASON[r[1]] for r in await self._db.run(renew)
        }

    async def save_progress(self, updates: Sequence[ProgressUpdate]) -> set[str]:
        """Write progress/data of running tasks whose lease still holds, with their
        PROGRESS events, in one statement."""
        if not updates:
            return set()
        args = (*progress_arrays(updates), self._events_lock, self.channel)

        async def save(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.sql.save_progress, *args))

        return {r[0] for r in await self._db.run(save)}

    async def rescue_expired(self, *, limit: int = 1000) -> list[Task]:
        """Take back RUNNING tasks whose lease expired by the database clock, with one
        statement (``Statements.rescue``); rows are picked with ``FOR UPDATE SKIP
        LOCKED``, so every worker may run this at once and each expired task is rescued
        once."""
        if limit <= 0:
            return []

        async def rescue(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.sql.rescue, limit, self._events_lock, self.channel))

        return [rows.task(r) for r in await self._db.run(rescue)]

    async def retry(self, task_id: str) -> Task:
        """Redrive a FAILED or CANCELLED leader to PENDING with a fresh budget, in one
        transaction (the task row locked while deciding).

        :raises TaskNotFound: no such task.
        :raises InvalidTransition: the task is active, an alias, or another leader is
            active for its dedupe key.
        """

        async def redrive(conn: Conn) -> Task:
            found = await conn.fetchrow(self.sql.lock_for_redrive, task_id)
            if found is None:
                raise TaskNotFound(f"no task {task_id}")
            seq, status, alias_of, app_id, task_type, dedupe_key = found
            check_redrive(task_id, rows.STATUS[status], alias_of)
            if dedupe_key is not None:
                leader = await conn.fetchval(self.sql.find_leader, app_id, task_type, dedupe_key)
                if leader is not None:
                    raise key_taken(task_id, leader, dedupe_key)
            try:
                async with conn.transaction():  # a savepoint: the unique index may refuse
                    row = await conn.fetchrow(self.sql.redrive, seq)
                    assert row is not None  # the row is locked: it exists
            except asyncpg.exceptions.UniqueViolationError:
                leader = await conn.fetchval(self.sql.find_leader, app_id, task_type, dedupe_key)
                raise key_taken(task_id, str(leader), dedupe_key) from None
            events = Events()
            events.add(seq, REDRIVE_EVENT.value, "pending")
            await self._events.append(conn, events, [StoreChange.WORK])
            return rows.task(row)

        return await self._db.run(redrive, transaction=True)

    # -- reading -------------------------------------------------------------------------

    async def get(self, task_id: str) -> Task | None:
        """The current snapshot of one task, or None."""

        async def get(conn: Conn) -> Record | None:
            row: Record | None = await conn.fetchrow(self.sql.get, task_id)
            return row

        row = await self._db.run(get)
        return None if row is None else rows.task(row)

    async def deleted_task(self, task_id: str) -> Task | None:
        """The tombstone of a task its finish deleted (``Finish.delete``), from one
        lookup of ``tombstones`` by id; None for any other id."""

        async def read(conn: Conn) -> Record | None:
            row: Record | None = await conn.fetchrow(self.sql.deleted_task, task_id)
            return row

        row = await self._db.run(read)
        return None if row is None else rows.task(row)

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
        sql, args = page_sql(
            translate(filter, DIALECT), table=f"{self.sql.quoted}.tasks", columns=TASK_COLUMNS,
            limit=limit, offset=max(offset, 0), newest_first=newest_first, after=after,
        )  # fmt: skip

        async def query(conn: Conn) -> list[Record]:
            await conn.execute(SEQ_SCANS_ALLOWED)
            return list(await conn.fetch(sql, *args))

        return [rows.task(r) for r in await self._db.run(query, transaction=True)]

    async def summary(self, filter: TaskFilter) -> ProgressSummary:
        """Counts by status from one ``GROUP BY status`` query; no task is loaded."""
        where, args = filter_sql(filter)
        sql = (
            "SELECT status, count(*), count(*) FILTER (WHERE waiting_on > 0)"
            f" FROM {self.sql.quoted}.tasks WHERE {where} GROUP BY status"
        )

        async def summarize(conn: Conn) -> list[Record]:
            await conn.execute(SEQ_SCANS_ALLOWED)
            return list(await conn.fetch(sql, *args))

        found = await self._db.run(summarize, transaction=True)
        counts = {r[0]: r[1] for r in found}
        waiting = sum(r[2] for r in found if r[0] == "pending")
        return ProgressSummary.from_counts(counts, waiting=waiting)

    async def attempts(self, task_id: str) -> list[Attempt]:
        """The execution log of one task in insertion order (empty for an unknown id)."""

        async def read(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.sql.attempts, task_id))

        return [rows.attempt(task_id, r) for r in await self._db.run(read)]

    async def next_run_at(self, handlers: Sequence[HandlerKey]) -> datetime | None:
        """The earliest ``run_at`` of a claimable PENDING leader for ``handlers`` that
        no stored suspension covers; one statement."""
        host_types = {t for a, t in handlers if a is None}
        keys = {(a, t) for a, t in handlers if a is None or t not in host_types}
        if not keys:
            return None
        types = [t for _, t in keys]
        apps = [a for a, _ in keys]

        async def earliest(conn: Conn) -> datetime | None:
            value: datetime | None = await conn.fetchval(self.sql.next_run_at, types, apps)
            return value

        return await self._db.run(earliest)

    # -- retention -----------------------------------------------------------------------

    async def cleanup(
        self,
        older_than: timedelta,
        *,
        statuses: frozenset[TaskStatus] = _CLEANED_BY_DEFAULT,
    ) -> int:
        """Delete terminal tasks in ``statuses`` that finished more than ``older_than``
        ago (by the database clock), with their execution logs, in one statement.

        Their events stay until :meth:`prune_events` removes them by age;
        :meth:`read_events` skips them.

        :raises ValueError: ``statuses`` includes an active status.
        """
        if any(s.active for s in statuses):
            raise ValueError("cleanup deletes terminal tasks only")
        if not statuses:
            return 0
        seconds = older_than.total_seconds()
        values = [s.value for s in statuses]

        async def delete(conn: Conn) -> int:
            count: int = await conn.fetchval(self.sql.cleanup, seconds, values)
            return count

        return await self._db.run(delete)

    # -- control -------------------------------------------------------------------------

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
        ``cascade``, and a cancelled leader's aliases; one transaction. See
        :meth:`TaskStorage.cancel`.

        :raises ValueError: neither ``task_ids`` nor ``filter`` was given.
        :returns: every changed task: the selection and its descendants in that order,
            each cancelled leader followed by its aliases.
        """
        if task_ids is None and filter is None:
            raise ValueError("cancel needs task_ids or a filter")
        ids = None if task_ids is None else list(task_ids)

        async def cancel(conn: Conn) -> list[Task]:
            return await self._cancellation.cancel(conn, ids, filter, reason, cascade)

        return await self._db.run(cancel, transaction=True)

    async def watch_leases(self, leases: Sequence[Lease]) -> dict[str, CancelReason | None]:
        """The requested stop (or None) of each lease that still holds — recorded, or
        'suspended' when the task's scope is suspended now; one read-only statement."""
        if not leases:
            return {}
        ids, workers, attempts = lease_arrays(leases)

        async def watch(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.sql.watch, ids, workers, attempts))

        return {
            r[0]: None if r[1] is None else rows.REASON[r[1]] for r in await self._db.run(watch)
        }

    async def suspend(self, scope: SuspensionScope) -> int:
        """Store ``scope`` (idempotent) and ask the running tasks in it to stop, with
        their events and a ``control`` notification, in one statement. Claims check the
        stored suspensions in their own statement; a claim that ran concurrently with
        this one is caught by the lease checks, which report 'suspended' for any held
        task whose scope is suspended.

        :returns: how many running tasks were asked to stop.
        """

        async def suspend(conn: Conn) -> int:
            asked: int = await conn.fetchval(
                self.sql.suspend, scope.task_type, scope.app_id, self._events_lock, self.channel
            )
            return asked

        return await self._db.run(suspend)

    async def resume(self, scope: SuspensionScope) -> bool:
        """Delete exactly ``scope`` (and notify ``work``); whether it was stored."""

        async def resume(conn: Conn) -> bool:
            deleted = await conn.fetchval(
                self.sql.resume, scope.task_type, scope.app_id, self.channel
            )
            return bool(deleted)

        return await self._db.run(resume)

    async def suspensions(self) -> list[SuspensionScope]:
        """The stored suspensions, sorted by (task type, app id)."""

        async def read(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.sql.suspensions))

        scopes = [SuspensionScope(task_type=t, app_id=a) for t, a in await self._db.run(read)]
        scopes.sort(key=lambda s: (s.task_type or "", s.app_id or ""))
        return scopes

    async def read_events(
        self, after: str | None, *, limit: int = 1000
    ) -> tuple[list[TaskEvent], str]:
        """Up to ``limit`` events after cursor ``after`` in seq (commit) order, each
        with its task's current snapshot, from one ``SELECT``. ``after`` None returns
        the cursor of the last event committed. Events of a task a deleting finish
        removed carry its tombstone; those of tasks deleted by :meth:`cleanup` are
        skipped, and the returned cursor moves past them too. Cursors are the seq
        written by :func:`taskmill.cursors.position_token`; any other ``after`` raises
        :class:`~taskmill.errors.InvalidCursor`."""
        if after is None:
            return [], position_token(await self._db.run(self._events.last_seq))
        position = token_position(after)
        if limit <= 0:
            return [], after

        async def read(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.sql.read_events, position, limit))

        found = await self._db.run(read)
        if not found:
            return [], after
        events = events_of_rows(found, task=rows.task, timestamp=_as_is)
        return events, position_token(int(found[-1][0]))

    async def prune_events(self, older_than: timedelta) -> int:
        """Delete the events recorded more than ``older_than`` ago: the prefix of the
        log before the first younger one (so never a young one, even when the clocks of
        transactions disagree a little); and, in the same statement, the tombstones of
        tasks deleted that long ago. Returns how many events."""
        seconds = older_than.total_seconds()

        async def prune(conn: Conn) -> int:
            status: str = await conn.execute(self.sql.prune_events, seconds)
            return int(status.rsplit(" ", 1)[-1])

        return await self._db.run(prune)

    # -- handler registrations (registrations.py) -------------------------------------

    async def put_handler_registration(
        self, registration: HandlerRegistration
    ) -> HandlerRegistration:
        """Insert or replace the registration of its (app id, task type), stamped with
        the database clock, in one statement."""
        arguments = upsert_arguments(registration)

        async def put(conn: Conn) -> Any:
            return await conn.fetchval(self.registration_sql.upsert, *arguments)

        updated_at = await self._db.run(put)
        return attrs.evolve(registration, updated_at=updated_at)

    async def delete_handler_registration(self, app_id: str | None, task_type: str) -> bool:
        """Delete one registration; whether it existed."""

        async def delete(conn: Conn) -> str:
            result: str = await conn.execute(self.registration_sql.delete, app_id, task_type)
            return result

        return (await self._db.run(delete)) != "DELETE 0"

    async def handler_registrations(self) -> list[HandlerRegistration]:
        """Every registration, the host's first, then by app id and task type."""

        async def read(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.registration_sql.select))

        return from_rows(await self._db.run(read))

    # -- the worker registry (workers.py) ---------------------------------------------

    async def put_worker(self, worker_id: str, record: str) -> None:
        """Insert or replace the registration of ``worker_id``, its heartbeat the
        database clock, in one statement."""

        async def put(conn: Conn) -> None:
            await conn.execute(self.worker_sql.upsert, worker_id, record)

        await self._db.run(put)

    async def workers(self) -> list[StoredWorker]:
        """Every registration, by worker id."""

        async def read(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.worker_sql.select))

        return workers_of_rows(await self._db.run(read))

    async def remove_worker(self, worker_id: str) -> bool:
        """Delete the registration of ``worker_id``; whether there was one."""

        async def delete(conn: Conn) -> int:
            return deleted(await conn.execute(self.worker_sql.delete, worker_id))

        return (await self._db.run(delete)) > 0

    async def prune_workers(self, older_than: timedelta) -> int:
        """Delete the registrations whose heartbeat is more than ``older_than`` older
        than the database clock; how many."""
        seconds = older_than.total_seconds()

        async def prune(conn: Conn) -> int:
            return deleted(await conn.execute(self.worker_sql.prune, seconds))

        return await self._db.run(prune)


def _as_is(at: datetime) -> datetime:
    """asyncpg reads a ``timestamptz`` as a tz-aware datetime already."""
    return at
