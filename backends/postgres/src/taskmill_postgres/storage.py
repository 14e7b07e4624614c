"""``postgresql://`` — task storage in a PostgreSQL schema, shared by any number of
worker processes on any number of machines.

Design:

- An asyncpg connection pool per storage object. Each domain operation takes one
  connection for its duration; most are one SQL statement (one round trip, an implicit
  transaction), the rest one explicit transaction.
- Claims are one ``UPDATE ... WHERE seq = ANY(ARRAY(SELECT ... FOR UPDATE SKIP LOCKED))``
  statement over the partial ``tasks_claim`` index (see
  :meth:`Statements.claim_arguments`): concurrent workers skip each other's rows instead
  of waiting, and no task is returned twice.
- State changes are fenced by (id, RUNNING, worker id, attempt) in their WHERE clause;
  batches of finishes, renewals and progress travel as arrays (``unnest``), one
  statement per batch.
- Every change appends its events in its own transaction, behind the events lock, so
  event seqs follow commit order; the same transaction NOTIFYs the schema's channels
  (see :mod:`taskmill_postgres.listener`).
- Dedupe is enforced by a partial unique index on active leaders; an enqueue that loses
  a race for a leader is retried and becomes an alias (:meth:`PostgresStorage.enqueue`).
- The database clock (``now()``) is the store clock: every worker on every machine
  agrees on it.

Why one long module: one method per operation of the storage contract, each a thin
wrapper that runs its statement (statements.py) on the pool with the connection-loss
handling they share; the SQL, rows, options, schema and listener live in their own
modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, Self, TypeAlias, TypeVar
from urllib.parse import urlsplit

import asyncpg
import attrs
from taskmill.cursors import position_token, token_position
from taskmill.errors import (
    DuplicateTaskId,
    StorageUnavailable,
    TaskNotFound,
)
from taskmill.lifecycle import (
    CANCELLATION,
    REDRIVE_EVENT,
    cancel_error,
    cancel_targets,
    check_redrive,
    dependency_blocks,
    dependency_error,
    enqueued_batch,
    finish_rounds,
    key_taken,
    settles_aliases,
    split_taken,
    unknown_dependency,
)
from taskmill.model import (
    Attempt,
    CancelReason,
    EventKind,
    ProgressSummary,
    SuspensionScope,
    Task,
    TaskEvent,
    TaskFilter,
    TaskStatus,
)
from taskmill.serialization import dumps
from taskmill.storage import (
    ChangeListener,
    ClaimRequest,
    Finish,
    FinishKind,
    HandlerKey,
    HandlerRegistration,
    Lease,
    NewTask,
    ProgressUpdate,
    StorageCapabilities,
    StoreChange,
    TaskStorage,
)

from taskmill_postgres import rows, schema
from taskmill_postgres.limits import LimitStatements, apply_limits, spend_tokens
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
from taskmill_postgres.statements import TASK_COLUMNS, Statements, filter_sql

__all__ = ["PostgresStorage"]

T = TypeVar("T")
Record: TypeAlias = asyncpg.Record

_UNAVAILABLE: Final = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.InvalidAuthorizationSpecificationError,
    asyncpg.exceptions.InvalidCatalogNameError,
    asyncpg.exceptions.InternalClientError,
)
"""Errors that mean the server cannot be reached or used right now."""
_RETRYABLE: Final = (
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.SerializationError,
)
"""Errors after which PostgreSQL rolled the transaction back: safe to run it again."""
_MISSING: Final = (
    asyncpg.exceptions.UndefinedTableError,
    asyncpg.exceptions.InvalidSchemaNameError,
)
_ATTEMPTS: Final = 8
_FINISH_KIND: Final = {
    FinishKind.COMPLETE: "complete",
    FinishKind.RETRY: "retry",
    FinishKind.FAIL: "fail",
    FinishKind.RELEASE: "release",
    FinishKind.CANCEL: "cancel",
}
_NO_PROGRESS: Final = (False, None, None, None)
_CLEANED_BY_DEFAULT: Final = frozenset({TaskStatus.COMPLETED, TaskStatus.CANCELLED})

_CANCELLED: Final = CANCELLATION.event.value
_CANCEL_REQUESTED: Final = EventKind.CANCEL_REQUESTED.value


class _Events:
    """The events one transaction appends (task seq, kind, status), in order."""

    __slots__ = ("kinds", "seqs", "statuses")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.kinds: list[str] = []
        self.statuses: list[str] = []

    def add(self, seq: int, kind: str, status: str) -> None:
        self.seqs.append(seq)
        self.kinds.append(kind)
        self.statuses.append(status)

    def __bool__(self) -> bool:
        return bool(self.seqs)


def _password_hint(url: str) -> str:
    """Where the refused password came from, and where a password can be given."""
    places = (
        "the URL (postgresql://user:password@host/db), $PGPASSWORD, or ~/.pgpass "
        "(or the file $PGPASSFILE names)"
    )
    parts = urlsplit(url)
    if parts.password is not None or "password=" in parts.query:
        return f"the password in the URL was refused; a password is taken from {places}"
    if os.environ.get("PGPASSWORD"):
        return f"the password in $PGPASSWORD was refused; a password is taken from {places}"
    return (
        "the URL has no password and $PGPASSWORD is unset (so a ~/.pgpass entry, if any, "
        f"was refused); give one in {places}"
    )


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
        self.limit_sql = LimitStatements(self.schema)
        self._events_lock = lock_key("events", self.schema)
        self._pool: asyncpg.Pool | None = None
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
        return f"PostgreSQL at {self._parsed.where}"

    # -- connections -------------------------------------------------------------------

    def _server_settings(self) -> dict[str, str]:
        settings = {
            "application_name": self.options.application_name,
            # Every statement is prepared once per connection and its plan does not
            # depend on the argument values (index scans of the partial indexes, keyed
            # lookups, arrays): planning it again on every call (PostgreSQL's "custom
            # plans") costs more than running it for the small batches of a worker.
            "plan_cache_mode": "force_generic_plan",
            # JIT compilation would add tens of milliseconds to statements whose
            # estimated cost grows with the table, for nothing.
            "jit": "off",
        }
        if self.options.statement_timeout > 0:
            settings["statement_timeout"] = str(round(self.options.statement_timeout * 1000))
        return settings

    def _unavailable(self, exc: BaseException, doing: str = "use") -> StorageUnavailable:
        detail = str(exc).strip() or type(exc).__name__
        if isinstance(exc, asyncpg.exceptions.QueryCanceledError):
            detail += " (raise the statement_timeout option if this is expected)"
        if isinstance(exc, asyncpg.exceptions.InvalidPasswordError):
            detail += f"; {_password_hint(self.url)}"
        return StorageUnavailable(f"cannot {doing} {self.where}: {detail}")

    async def _connect(self) -> asyncpg.Connection[Record]:
        """A new connection outside the pool (migrations of a closed store, LISTEN)."""
        try:
            conn: asyncpg.Connection[Record] = await asyncpg.connect(
                self._parsed.dsn,
                timeout=self.options.connect_timeout,
                command_timeout=self.options.command_timeout,
                server_settings=self._server_settings(),
                statement_cache_size=0,
            )
        except (*_UNAVAILABLE, asyncpg.PostgresError) as exc:
            raise self._unavailable(exc, "connect to") from exc
        return conn

    async def _create_pool(self) -> asyncpg.Pool:
        try:
            pool = await asyncpg.create_pool(
                self._parsed.dsn,
                min_size=self.options.pool_min_size,
                max_size=self.options.pool_max_size,
                timeout=self.options.connect_timeout,
                command_timeout=self.options.command_timeout,
                server_settings=self._server_settings(),
                reset=_keep_session,
            )
        except (*_UNAVAILABLE, asyncpg.PostgresError) as exc:
            raise self._unavailable(exc, "connect to") from exc
        assert pool is not None
        return pool

    async def _run(
        self,
        fn: Callable[[Conn], Awaitable[T]],
        *,
        transaction: bool = False,
    ) -> T:
        """Run ``fn`` on a pooled connection (inside a transaction when asked); run it
        again after a deadlock or serialization failure (PostgreSQL rolled it back),
        and report an unreachable server as :class:`StorageUnavailable`."""
        pool = self._pool
        if pool is None:
            raise StorageUnavailable(
                f"the PostgreSQL storage {redact(self.url)} is not open; await storage.open() first"
            )
        for attempt in range(_ATTEMPTS):
            try:
                async with pool.acquire() as conn:
                    if not transaction:
                        return await fn(conn)
                    async with conn.transaction():
                        return await fn(conn)
            except _RETRYABLE as exc:
                if attempt == _ATTEMPTS - 1:
                    raise self._unavailable(exc) from exc
                await asyncio.sleep(random.uniform(0.001, 0.01) * 2**attempt)
            except _MISSING as exc:
                raise StorageUnavailable(
                    f"the taskmill schema {self.schema} of {self.where} is missing a table "
                    f"({exc}); create it with: taskmill migrate --url {redact(self.url)}"
                ) from exc
            except _UNAVAILABLE as exc:
                raise self._unavailable(exc) from exc
        raise AssertionError("unreachable")

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
            if self._pool is not None:
                return
            pool = await self._create_pool()
            try:
                async with pool.acquire() as conn:
                    await self._check_schema(conn, auto_migrate)
            except BaseException as exc:
                pool.terminate()
                if isinstance(exc, (*_UNAVAILABLE, asyncpg.PostgresError)):
                    raise self._unavailable(exc, "prepare") from exc
                raise
            self._pool = pool

    async def _check_schema(self, conn: Conn, auto_migrate: bool) -> None:
        name = self.schema
        url = redact(self.url)
        version = await schema.check(conn, name, self.where, url, auto_migrate=auto_migrate)
        if version < schema.latest_version():
            await schema.apply_pending(conn, name, self.where)

    async def close(self) -> None:
        """Close the pool's connections. Safe to call twice; operations called
        afterwards raise :class:`StorageUnavailable`."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            async with asyncio.timeout(10):
                await pool.close()
        except (*_UNAVAILABLE, asyncpg.PostgresError):
            pool.terminate()

    async def exists(self) -> bool:
        """Whether the schema holds tables (taskmill's or, for :meth:`open` to refuse,
        someone else's); connects once, creates nothing."""
        conn = await self._connect()
        try:
            return bool(await schema.schema_tables(conn, self.schema))
        except (*_UNAVAILABLE, asyncpg.PostgresError) as exc:
            raise self._unavailable(exc, "inspect") from exc
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
        conn = await self._connect()
        try:
            return await schema.apply_pending(conn, self.schema, self.where)
        except (*_UNAVAILABLE, asyncpg.PostgresError) as exc:
            raise self._unavailable(exc, "migrate") from exc
        finally:
            try:
                async with asyncio.timeout(5):
                    await conn.close()
            except (*_UNAVAILABLE, asyncpg.PostgresError):
                conn.terminate()

    async def change_listener(self) -> ChangeListener:
        """A listener on this schema's NOTIFY channels, over a dedicated connection that
        reconnects by itself (see :class:`PostgresChangeListener`); the caller closes it.

        :raises StorageUnavailable: the server cannot be reached.
        """
        return await PostgresChangeListener.open(self._connect, self.channel)

    # -- the events of a transaction -------------------------------------------------------

    async def _append_events(
        self, conn: Conn, events: _Events, also: Sequence[StoreChange] = ()
    ) -> None:
        """Append ``events`` behind the events lock and notify EVENTS (and ``also``):
        the last statement of a multi-statement transaction."""
        if events:
            await conn.execute(
                self.sql.insert_events,
                self._events_lock,
                self.channel,
                [kind.value for kind in also],
                events.seqs,
                events.kinds,
                events.statuses,
            )

    async def _settle_aliases(
        self, conn: Conn, leaders: Sequence[Record]
    ) -> dict[int, list[Record]]:
        """Give the pending aliases of ``leaders`` (terminal leaders with a dedupe key)
        their leader's outcome (the ``settle_aliases`` function), after the leaders'
        update in the same transaction.

        :returns: the aliases' new rows by leader seq, in creation order.
        """
        by_leader: dict[int, list[Record]] = {}
        if not leaders:
            return by_leader
        settled = await conn.fetch(self.sql.settle_aliases, [r[rows.SEQ] for r in leaders])
        if settled:
            found = await conn.fetch(self.sql.by_seq, [r[0] for r in settled])
            leader_of = {r[0]: r[1] for r in settled}
            for row in sorted(found, key=lambda r: r[rows.SEQ]):
                by_leader.setdefault(leader_of[row[rows.SEQ]], []).append(row)
        return by_leader

    # -- writing tasks -------------------------------------------------------------------

    async def enqueue(self, tasks: Sequence[NewTask]) -> list[Task]:
        """Insert ``tasks`` with one statement (all or none), their ENQUEUED events and
        a ``work`` notification with them.

        Dedupe leaders are decided in the statement: a keyed task becomes an alias of
        its scope's active leader (share-locked while deciding), else of the first task
        of its scope in this call, else it leads. The ``tasks_dedupe_leader`` unique
        index is the arbiter: when a concurrent enqueue committed a leader this
        statement could not see, the insert fails on that index and the statement runs
        again, finding that leader. Concurrent enqueues therefore yield one leader and
        aliases, never an error. Ids already stored follow the duplicate-id rule
        (:func:`~taskmill.lifecycle.split_taken`); an id committed concurrently makes
        the insert fail on ``tasks_id_key`` and run again, returning that task.

        :returns: the stored snapshots, in the order given.
        """
        if not tasks:
            return []
        wanted = list(dict.fromkeys(new.id for new in tasks))
        keyed = any(new.dedupe_key is not None for new in tasks)
        sql = self.sql.enqueue if keyed else self.sql.enqueue_unkeyed
        depends = any(new.after for new in tasks)

        async def attempt(conn: Conn, fresh: list[NewTask]) -> tuple[Record, dict[str, Record]]:
            waiting = [0] * len(fresh)
            edges: tuple[list[str], list[str], list[bool]] = ([], [], [])
            blocked: dict[int, str] = {}
            if depends:
                blocked = await self._dependencies(conn, fresh, waiting, edges)
            row = await conn.fetchrow(sql, *self._enqueue_args(fresh, waiting))
            assert row is not None  # an aggregate: always one row
            if edges[0]:
                await conn.execute(self.sql.insert_dependencies, *edges)
            cancelled: dict[str, Record] = {}
            if blocked:
                events = _Events()
                for index, error in blocked.items():
                    found = await conn.fetchrow(
                        self.sql.cancel_for_dependency, fresh[index].id, error
                    )
                    assert found is not None  # inserted just now
                    cancelled[fresh[index].id] = found
                    events.add(found[rows.SEQ], _CANCELLED, "cancelled")
                await self._append_events(conn, events)
            return row, cancelled

        async def insert(
            conn: Conn,
        ) -> tuple[list[NewTask], dict[str, Task], Record | None, dict[str, Record]]:
            for round_ in range(_ATTEMPTS):
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
                    return fresh, known, None, {}
                try:
                    if depends:
                        async with conn.transaction():  # a savepoint, for the retry
                            row, cancelled = await attempt(conn, fresh)
                    else:
                        row, cancelled = await attempt(conn, fresh)
                except asyncpg.exceptions.UniqueViolationError as exc:
                    if exc.constraint_name in ("tasks_dedupe_leader", "tasks_id_key"):
                        # a leader or one of these ids committed meanwhile: run again,
                        # as its alias or returning that task
                        continue
                    raise
                return fresh, known, row, cancelled
            raise StorageUnavailable(
                f"enqueueing on {self.where} kept racing concurrent enqueues of the same"
                " dedupe keys or task ids"
            )

        fresh, known, row, cancelled = await self._run(insert, transaction=depends)
        if row is not None:
            leaders = dict(zip(row[1] or (), row[2] or (), strict=True))
            stored = enqueued_batch(fresh, now=row[0], alias_of=leaders)
            known.update(zip([new.id for new in fresh], stored, strict=True))
            for task_id, found in cancelled.items():
                known[task_id] = rows.task(found)
        return [known[new.id] for new in tasks]

    def _enqueue_args(self, tasks: Sequence[NewTask], waiting: list[int]) -> tuple[object, ...]:
        """The arguments of the enqueue statement for ``tasks``: ten JSON arrays (one per
        column, the fourth of the params objects), the events lock and the channel
        prefix, then each task's count of unfinished dependencies (``waiting``)."""
        n = len(tasks)
        apps = [new.app_id for new in tasks]
        run_ats = [new.run_at for new in tasks]
        keys = [new.dedupe_key for new in tasks]
        parents = [new.parent_id for new in tasks]
        users = [new.user_id for new in tasks]
        # A column of nothing but NULLs (zeros for waiting) is sent as NULL: the
        # statement reads the missing elements as NULL (NULL waiting as 0).
        return (
            dumps([new.id for new in tasks]),
            dumps([new.task_type for new in tasks]),
            _json_or_null(apps, n),
            "[" + ",".join([new.params_json for new in tasks]) + "]",
            dumps([int(new.priority) for new in tasks]),
            dumps([new.max_retries for new in tasks]),
            None if run_ats.count(None) == n else dumps(
                [None if at is None else at.isoformat() for at in run_ats]
            ),
            _json_or_null(keys, n), _json_or_null(parents, n), _json_or_null(users, n),
            self._events_lock, self.channel, None if waiting.count(0) == n else dumps(waiting),
        )  # fmt: skip

    async def _dependencies(
        self,
        conn: Conn,
        tasks: Sequence[NewTask],
        waiting: list[int],
        edges: tuple[list[str], list[str], list[bool]],
    ) -> dict[int, str]:
        """Read (share-locked) and check the dependencies of ``tasks``; fill in each
        task's count of unfinished ones (``waiting``) and the edges to write.

        :returns: by task index, the error of the tasks to cancel at once (a dependency
            already ended without completing).
        :raises InvalidTaskSpec: a dependency is missing or another app's.
        """
        wanted = list(dict.fromkeys(d for new in tasks for d in new.after))
        found = {r[0]: (r[1], r[2]) for r in await conn.fetch(self.sql.lock_dependencies, wanted)}
        blocked: dict[int, str] = {}
        for index, new in enumerate(tasks):
            for dependency in new.after:
                if dependency not in found:
                    raise unknown_dependency(dependency, new.app_id, None)
                status, app_id = found[dependency]
                if app_id != new.app_id:
                    raise unknown_dependency(dependency, new.app_id, app_id)
                blocks = dependency_blocks(rows.STATUS[status], new.after_always)
                if blocks is None:
                    waiting[index] += 1
                    edges[0].append(dependency)
                    edges[1].append(new.id)
                    edges[2].append(new.after_always)
                elif blocks and index not in blocked:
                    blocked[index] = dependency_error(dependency, rows.STATUS[status])
        return blocked

    async def claim_batch(self, request: ClaimRequest) -> list[Task]:
        """Claim up to ``request.limit`` due PENDING leaders with one statement, which
        also writes their STARTED events (see :meth:`Statements.claim_arguments`).

        :returns: the claimed snapshots in claim order (priority DESC, then creation).
        """
        if request.limit <= 0 or not request.handlers:
            return []
        if request.limits:
            return await self._run(
                lambda conn: self._claim_limited(conn, request), transaction=True
            )
        statement = self.sql.claim_arguments(request, self._events_lock, self.channel)
        if statement is None:
            return []
        sql, args = statement

        async def claim(conn: Conn) -> list[Record]:
            return list(await conn.fetch(sql, *args))

        found = await self._run(claim)
        return rows.claim_order(found) if found else []

    async def _claim_limited(self, conn: Conn, request: ClaimRequest) -> list[Task]:
        """A claim under global limits, in one transaction: lock the limited keys'
        ``rate_buckets`` rows, count their RUNNING tasks, claim within what they allow,
        write the spent tokens back (see :mod:`taskmill_postgres.limits`)."""
        limited = await apply_limits(conn, self.limit_sql, request)
        statement = self.sql.claim_arguments(limited.request, self._events_lock, self.channel)
        if statement is None:
            return []
        sql, args = statement
        found = list(await conn.fetch(sql, *args))
        claimed = rows.claim_order(found) if found else []
        await spend_tokens(conn, self.limit_sql, limited, claimed)
        return claimed

    async def finish_batch(self, finishes: Sequence[Finish]) -> list[Task | None]:
        """Apply many attempt ends with one statement (see ``Statements.finish``): every
        finish kind at once from arrays, each fenced by (id, RUNNING, worker id,
        attempt), with the execution-log rows, the terminal leaders' aliases, the
        events and the notification.

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
                done = await conn.fetch(
                    self.sql.finish,
                    *_finish_arrays(finishes, indexes),
                    self._events_lock,
                    self.channel,
                )
                for row in done:
                    results[indexes[row["ord"] - 1]] = rows.task(row)
            return results

        return await self._run(apply, transaction=len(rounds) > 1)

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
                done = await conn.fetch(
                    self.sql.finish_applied,
                    *_finish_arrays(finishes, indexes),
                    self._events_lock,
                    self.channel,
                )
                for row in done:
                    applied[indexes[row[0] - 1]] = True
            return applied

        return await self._run(apply, transaction=len(rounds) > 1)

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
        ids, workers, attempts = _lease_arrays(leases)

        async def renew(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.sql.renew, ids, workers, attempts, lease_seconds))

        return {r[0]: None if r[1] is None else rows.REASON[r[1]] for r in await self._run(renew)}

    async def save_progress(self, updates: Sequence[ProgressUpdate]) -> set[str]:
        """Write progress/data of running tasks whose lease still holds, with their
        PROGRESS events, in one statement."""
        if not updates:
            return set()
        last = {u.lease.task_id: u for u in updates}  # one write per task: the last
        ids: list[str] = []
        workers: list[str] = []
        attempts: list[int] = []
        has: list[bool] = []
        done: list[float | None] = []
        total: list[float | None] = []
        message: list[str | None] = []
        data: list[str | None] = []
        for update in last.values():
            lease = update.lease
            ids.append(lease.task_id)
            workers.append(lease.worker_id)
            attempts.append(lease.attempt)
            progress = update.progress
            if progress is None:
                has.append(False)
                done.append(None)
                total.append(None)
                message.append(None)
            else:
                has.append(True)
                done.append(float(progress.done))
                total.append(None if progress.total is None else float(progress.total))
                message.append(progress.message)
            data.append(None if update.data is None else dumps(update.data))
        args = (
            ids, workers, attempts, has, done, total, message, data,
            self._events_lock, self.channel,
        )  # fmt: skip

        async def save(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.sql.save_progress, *args))

        return {r[0] for r in await self._run(save)}

    async def rescue_expired(self, *, limit: int = 1000) -> list[Task]:
        """Take back RUNNING tasks whose lease expired by the database clock, with one
        statement (``Statements.rescue``); rows are picked with ``FOR UPDATE SKIP
        LOCKED``, so every worker may run this at once and each expired task is rescued
        once."""
        if limit <= 0:
            return []

        async def rescue(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.sql.rescue, limit, self._events_lock, self.channel))

        return [rows.task(r) for r in await self._run(rescue)]

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
            events = _Events()
            events.add(seq, REDRIVE_EVENT.value, "pending")
            await self._append_events(conn, events, [StoreChange.WORK])
            return rows.task(row)

        return await self._run(redrive, transaction=True)

    # -- reading -------------------------------------------------------------------------

    async def get(self, task_id: str) -> Task | None:
        """The current snapshot of one task, or None."""

        async def get(conn: Conn) -> Record | None:
            row: Record | None = await conn.fetchrow(self.sql.get, task_id)
            return row

        row = await self._run(get)
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
        where, args = filter_sql(filter)
        order = "DESC" if newest_first else "ASC"
        if after is not None:
            args = [*args, after]
            where = (
                f"({where}) AND seq {'<' if newest_first else '>'} (SELECT seq FROM "
                f"{self.sql.quoted}.tasks WHERE id = ${len(args)}::text)"
            )
        n = len(args)
        sql = (
            f"SELECT {TASK_COLUMNS} FROM {self.sql.quoted}.tasks WHERE {where} "
            f"ORDER BY seq {order} LIMIT ${n + 1}::bigint OFFSET ${n + 2}::bigint"
        )

        async def query(conn: Conn) -> list[Record]:
            return list(await conn.fetch(sql, *args, limit, max(offset, 0)))

        return [rows.task(r) for r in await self._run(query)]

    async def summary(self, filter: TaskFilter) -> ProgressSummary:
        """Counts by status from one ``GROUP BY status`` query; no task is loaded."""
        where, args = filter_sql(filter)
        sql = (
            "SELECT status, count(*), count(*) FILTER (WHERE waiting_on > 0)"
            f" FROM {self.sql.quoted}.tasks WHERE {where} GROUP BY status"
        )

        async def summarize(conn: Conn) -> list[Record]:
            return list(await conn.fetch(sql, *args))

        found = await self._run(summarize)
        counts = {r[0]: r[1] for r in found}
        waiting = sum(r[2] for r in found if r[0] == "pending")
        return ProgressSummary.from_counts(counts, waiting=waiting)

    async def attempts(self, task_id: str) -> list[Attempt]:
        """The execution log of one task in insertion order (empty for an unknown id)."""

        async def read(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.sql.attempts, task_id))

        return [rows.attempt(task_id, r) for r in await self._run(read)]

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

        return await self._run(earliest)

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

        return await self._run(delete)

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
            targets = await self._cancel_targets(conn, ids, filter, cascade)
            if not targets:
                return []
            if not reason.terminal:
                return await self._request_stop(conn, targets, reason)
            return await self._cancel(conn, targets, reason)

        return await self._run(cancel, transaction=True)

    async def _cancel_targets(
        self,
        conn: Conn,
        task_ids: Sequence[str] | None,
        filter: TaskFilter | None,
        cascade: bool,
    ) -> list[str]:
        """The ids a cancel applies to, in the reference store's order: those named, the
        active tasks ``filter`` selects (in creation order), then breadth first their
        descendants (each task's children in creation order)."""
        order: dict[str, None] = dict.fromkeys(task_ids or ())
        if filter is not None:
            where, args = filter_sql(filter)
            found = await conn.fetch(
                f"SELECT id FROM {self.sql.quoted}.tasks WHERE ({where}) "
                "AND status IN ('pending', 'running') ORDER BY seq",
                *args,
            )
            order.update((r[0], None) for r in found)

        async def children_of(level: list[str]) -> list[tuple[str, str]]:
            return [(r[0], r[1]) for r in await conn.fetch(self.sql.children, level)]

        return await cancel_targets(order, children_of if cascade else None)

    async def _request_stop(
        self, conn: Conn, targets: list[str], reason: CancelReason
    ) -> list[Task]:
        """SUSPENDED, SHUTDOWN: a running task without a request yet is asked to stop."""
        found = {
            r[rows.ID]: r for r in await conn.fetch(self.sql.request_stop, reason.value, targets)
        }
        changed = [found[i] for i in targets if i in found]
        events = _Events()
        for row in changed:
            events.add(row[rows.SEQ], _CANCEL_REQUESTED, "running")
        await self._append_events(conn, events, [StoreChange.CONTROL])
        return [rows.task(r) for r in changed]

    async def _cancel(self, conn: Conn, targets: list[str], reason: CancelReason) -> list[Task]:
        """A terminal reason: every selected active task ends CANCELLED, as if one by
        one in ``targets`` order."""
        position = {task_id: n for n, task_id in enumerate(targets)}
        active = await conn.fetch(self.sql.lock_active, targets)
        # An alias whose (active) leader comes before it is cancelled *by* that leader,
        # taking its outcome as aliases always do; otherwise it is cancelled alone.
        first = {r["id"]: position[r["id"]] for r in active}
        direct = [
            r["id"] for r in active if first.get(r["alias_of"], len(targets)) > position[r["id"]]
        ]
        cancelled = {r[rows.ID]: r for r in await conn.fetch(self.sql.cancel, reason.value, direct)}
        leaders = [
            r
            for r in cancelled.values()
            if settles_aliases(
                rows.STATUS[r[rows.STATUS_COL]], r[rows.DEDUPE_KEY], r[rows.ALIAS_OF]
            )
        ]
        events = _Events()
        aliases = await self._settle_aliases(conn, leaders)
        changed: list[Record] = []
        done: set[str] = set()
        for task_id in targets:
            row = cancelled.get(task_id)
            if row is None or task_id in done:
                continue
            done.add(task_id)
            changed.append(row)
            events.add(row[rows.SEQ], _CANCELLED, "cancelled")
            for alias in aliases.get(row[rows.SEQ], ()):
                done.add(alias[rows.ID])
                changed.append(alias)
                events.add(alias[rows.SEQ], _CANCELLED, "cancelled")
        if changed:
            seqs = await conn.fetchval(
                self.sql.settle_dependents,
                [r[rows.SEQ] for r in changed],
                self._events_lock,
                self.channel,
            )
            if seqs:
                changed += sorted(
                    await conn.fetch(self.sql.by_seq, list(seqs)), key=lambda r: r[rows.SEQ]
                )
        running = [r for r in active if r["status"] == "running"]
        if running:
            await conn.execute(
                self.sql.log_cancelled,
                [r["seq"] for r in running],
                [r["attempts"] for r in running],
                [r["worker_id"] or "" for r in running],
                [r["started_at"] for r in running],
                cancel_error(reason),
            )
        await self._append_events(conn, events, [StoreChange.CONTROL] if running else [])
        return [rows.task(r) for r in changed]

    async def watch_leases(self, leases: Sequence[Lease]) -> dict[str, CancelReason | None]:
        """The requested stop (or None) of each lease that still holds — recorded, or
        'suspended' when the task's scope is suspended now; one read-only statement."""
        if not leases:
            return {}
        ids, workers, attempts = _lease_arrays(leases)

        async def watch(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.sql.watch, ids, workers, attempts))

        return {r[0]: None if r[1] is None else rows.REASON[r[1]] for r in await self._run(watch)}

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

        return await self._run(suspend)

    async def resume(self, scope: SuspensionScope) -> bool:
        """Delete exactly ``scope`` (and notify ``work``); whether it was stored."""

        async def resume(conn: Conn) -> bool:
            deleted = await conn.fetchval(
                self.sql.resume, scope.task_type, scope.app_id, self.channel
            )
            return bool(deleted)

        return await self._run(resume)

    async def suspensions(self) -> list[SuspensionScope]:
        """The stored suspensions, sorted by (task type, app id)."""

        async def read(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.sql.suspensions))

        scopes = [SuspensionScope(task_type=t, app_id=a) for t, a in await self._run(read)]
        scopes.sort(key=lambda s: (s.task_type or "", s.app_id or ""))
        return scopes

    async def read_events(
        self, after: str | None, *, limit: int = 1000
    ) -> tuple[list[TaskEvent], str]:
        """Up to ``limit`` events after cursor ``after`` in seq (commit) order, each
        with its task's current snapshot, from one ``SELECT``. ``after`` None returns
        the cursor of the last event committed. Events whose task was deleted are
        skipped, and the returned cursor moves past them too. Cursors are the seq
        written by :func:`taskmill.cursors.position_token`; any other ``after`` raises
        :class:`~taskmill.errors.InvalidCursor`."""
        if after is None:
            return [], position_token(await self._run(self._current_cursor))
        position = token_position(after)
        if limit <= 0:
            return [], after

        async def read(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.sql.read_events, position, limit))

        found = await self._run(read)
        if not found:
            return [], after
        snapshots: dict[str, Task] = {}
        events: list[TaskEvent] = []
        for row in found:
            task_id = row[4 + rows.ID]
            if task_id is None:
                continue  # the task was deleted since (cleanup): skipped
            snapshot = snapshots.get(task_id)
            if snapshot is None:
                snapshot = snapshots[task_id] = rows.task(row[4:])
            events.append(rows.event(row, snapshot))
        return events, position_token(int(found[-1][0]))

    async def _current_cursor(self, conn: Conn) -> int:
        last: int | None = await conn.fetchval(self.sql.last_event)
        if last is not None:
            # Every event committed later has a larger seq (they are drawn under the
            # events lock, in commit order).
            return last
        # No event is stored: the counter, read while holding the events lock (so no
        # transaction has drawn a seq it has not committed yet).
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", self._events_lock)
            counter: int = await conn.fetchval(self.sql.event_counter)
        return counter

    async def prune_events(self, older_than: timedelta) -> int:
        """Delete the events recorded more than ``older_than`` ago: the prefix of the
        log before the first younger one (so never a young one, even when the clocks of
        transactions disagree a little); how many."""
        seconds = older_than.total_seconds()

        async def prune(conn: Conn) -> int:
            status: str = await conn.execute(self.sql.prune_events, seconds)
            return int(status.rsplit(" ", 1)[-1])

        return await self._run(prune)

    # -- handler registrations (registrations.py) -------------------------------------

    async def put_handler_registration(
        self, registration: HandlerRegistration
    ) -> HandlerRegistration:
        """Insert or replace the registration of its (app id, task type), stamped with
        the database clock, in one statement."""
        arguments = upsert_arguments(registration)

        async def put(conn: Conn) -> Any:
            return await conn.fetchval(self.registration_sql.upsert, *arguments)

        updated_at = await self._run(put)
        return attrs.evolve(registration, updated_at=updated_at)

    async def delete_handler_registration(self, app_id: str | None, task_type: str) -> bool:
        """Delete one registration; whether it existed."""

        async def delete(conn: Conn) -> str:
            result: str = await conn.execute(self.registration_sql.delete, app_id, task_type)
            return result

        return (await self._run(delete)) != "DELETE 0"

    async def handler_registrations(self) -> list[HandlerRegistration]:
        """Every registration, the host's first, then by app id and task type."""

        async def read(conn: Conn) -> list[Record]:
            return list(await conn.fetch(self.registration_sql.select))

        return from_rows(await self._run(read))


async def _keep_session(conn: asyncpg.Connection[Record]) -> None:
    """The pool's reset of a released connection: nothing beyond what asyncpg always
    does (roll back an open transaction, drop listeners).

    asyncpg's default reset is one more round trip per release (``pg_advisory_unlock_all``,
    ``CLOSE ALL``, ``UNLISTEN *``, ``RESET ALL``), as long as a short statement. No
    operation leaves session state on a pooled connection: locks are
    ``pg_advisory_xact_lock``, settings ``SET LOCAL``, no cursors, and LISTEN runs on
    the listener's own connection."""


def _or_null(values: list[Any], n: int) -> list[Any] | None:
    """``values`` (``n`` of them), or None when every one is None."""
    return None if values.count(None) == n else values


def _json_or_null(values: list[str | None], n: int) -> str | None:
    """``values`` (``n`` of them) as a JSON array, or None when every one is None."""
    return None if values.count(None) == n else dumps(values)


def _lease_arrays(leases: Sequence[Lease]) -> tuple[list[str], list[str], list[int]]:
    return (
        [x.task_id for x in leases],
        [x.worker_id for x in leases],
        [x.attempt for x in leases],
    )


def _finish_arrays(finishes: Sequence[Finish], indexes: list[int]) -> list[list[Any] | None]:
    """The 16 array arguments of ``Statements.finish`` for ``finishes[indexes]`` (some
    may be NULL, see :data:`_NULLABLE_FINISH_COLUMNS`)."""
    built: list[list[Any]] = [[] for _ in range(16)]
    (
        ids, workers, attempts, kinds, results, retry_in, errors, reasons, data,
        has_progress, done, total, message, outcomes, started, finished,
    ) = built  # fmt: skip
    for index in indexes:
        finish = finishes[index]
        lease = finish.lease
        ids.append(lease.task_id)
        workers.append(lease.worker_id)
        attempts.append(lease.attempt)
        kinds.append(_FINISH_KIND[finish.kind])
        results.append(finish.result_json if finish.kind is FinishKind.COMPLETE else None)
        retry_in.append(float(finish.retry_in))
        errors.append(finish.error)
        reasons.append(
            (finish.cancel_reason or CancelReason.USER).value
            if finish.kind is FinishKind.CANCEL
            else None
        )
        data.append(None if finish.data is None else dumps(finish.data))
        progress = finish.progress
        if progress is None:
            has, d, t, m = _NO_PROGRESS
        else:
            has = True
            d = float(progress.done)
            t = None if progress.total is None else float(progress.total)
            m = progress.message
        has_progress.append(has)
        done.append(d)
        total.append(t)
        message.append(m)
        outcomes.append(finish.outcome.value)
        started.append(finish.started_at)
        finished.append(finish.finished_at)
    n = len(ids)
    columns: list[list[Any] | None] = list(built)
    if has_progress.count(False) == n:
        # No finish saves progress: done, total and message are never read.
        columns[9] = columns[10] = columns[11] = columns[12] = None
    for position in _NULLABLE_FINISH_COLUMNS:
        if built[position].count(None) == n:
            columns[position] = None
    return columns


_NULLABLE_FINISH_COLUMNS: Final = (4, 6, 7, 8)
"""Positions in :func:`_finish_arrays` of the arrays (result, error, reason, data) sent
as NULL when they hold nothing but NULLs: ``unnest`` of several arrays pads a NULL one
with NULLs, so the statement reads the same values, and asyncpg does not encode a
thousand NULLs (it checks each element of an array for being a nested array)."""
