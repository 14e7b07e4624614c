"""Connections to the server: the asyncpg pool, the session settings every connection
gets, the runner that retries a rolled-back transaction, and how driver errors become
taskmill's.

Every connection runs with ``plan_cache_mode = force_generic_plan``, ``enable_seqscan =
off`` and ``jit = off`` (see :meth:`Database.server_settings`) and the
``statement_timeout`` option. A pooled connection is handed back as it is
(:func:`keep_session`): no operation leaves session state on it. A deadlock or
serialization failure rolled the transaction back: it is run again, a bounded number of
times, from the start. A server that cannot be reached or used is reported as
:class:`~taskmill.errors.StorageUnavailable` naming where it is and never the password;
a missing table names ``taskmill migrate``.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable
from typing import Final, TypeAlias, TypeVar
from urllib.parse import urlsplit

import asyncpg
from taskmill.errors import StorageUnavailable

from taskmill_postgres.options import ParsedURL, redact
from taskmill_postgres.schema import Conn

__all__ = [
    "MISSING",
    "RETRYABLE",
    "SEQ_SCANS_ALLOWED",
    "UNAVAILABLE",
    "Database",
    "Record",
    "keep_session",
    "password_hint",
]

T = TypeVar("T")
Record: TypeAlias = asyncpg.Record

SEQ_SCANS_ALLOWED: Final = "SET LOCAL enable_seqscan = on"
"""Run first in the transaction of a read over a filtered share of the tasks (a listing,
a summary), where a seq scan can beat every index: the session has them off
(:meth:`Database.server_settings`)."""

UNAVAILABLE: Final = (
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
RETRYABLE: Final = (
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.SerializationError,
)
"""Errors after which PostgreSQL rolled the transaction back: safe to run it again."""
MISSING: Final = (
    asyncpg.exceptions.UndefinedTableError,
    asyncpg.exceptions.InvalidSchemaNameError,
)
"""Errors that mean the taskmill schema is missing a table."""
_ATTEMPTS: Final = 8


def password_hint(url: str) -> str:
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


async def keep_session(conn: asyncpg.Connection[Record]) -> None:
    """The pool's reset of a released connection: nothing beyond what asyncpg always
    does (roll back an open transaction, drop listeners).

    asyncpg's default reset is one more round trip per release (``pg_advisory_unlock_all``,
    ``CLOSE ALL``, ``UNLISTEN *``, ``RESET ALL``), as long as a short statement. No
    operation leaves session state on a pooled connection: locks are
    ``pg_advisory_xact_lock``, settings ``SET LOCAL``, no cursors, and LISTEN runs on
    the listener's own connection."""


class Database:
    """The server behind one URL: a pool of connections with taskmill's session
    settings, opened by :meth:`start` and closed by :meth:`stop`; :meth:`run` runs an
    operation on it."""

    def __init__(self, parsed: ParsedURL, url: str) -> None:
        self.parsed = parsed
        self.url = url
        self.options = parsed.options
        self._pool: asyncpg.Pool | None = None

    @property
    def where(self) -> str:
        """Where the storage points, for messages: never the password."""
        return f"PostgreSQL at {self.parsed.where}"

    @property
    def pool(self) -> asyncpg.Pool | None:
        """The open pool, or None before :meth:`start` and after :meth:`stop`."""
        return self._pool

    def server_settings(self) -> dict[str, str]:
        """The session settings of every connection, pooled or not."""
        settings = {
            "application_name": self.options.application_name,
            # Every statement is prepared once per connection and its plan does not
            # depend on the argument values (index scans of the partial indexes, keyed
            # lookups, arrays): planning it again on every call (PostgreSQL's "custom
            # plans") costs more than running it for the small batches of a worker.
            "plan_cache_mode": "force_generic_plan",
            # That one plan is made at a connection's first use of a statement, from the
            # table as it is then: made while a table is new (never analyzed) or nearly
            # empty, it seq scans, and keeps seq scanning as the table grows until
            # autovacuum's next ANALYZE (measured: a finish of 10 tasks scanning 10,476
            # rows, 4.3 ms instead of 0.1). Every statement of a worker's path has an
            # index to take, so seq scans are off; the reads of a filtered share of the
            # table (query, summary) turn them back on for their own transaction.
            "enable_seqscan": "off",
            # JIT compilation would add tens of milliseconds to statements whose
            # estimated cost grows with the table, for nothing.
            "jit": "off",
        }
        if self.options.statement_timeout > 0:
            settings["statement_timeout"] = str(round(self.options.statement_timeout * 1000))
        return settings

    def unavailable(self, exc: BaseException, doing: str = "use") -> StorageUnavailable:
        """``exc`` as the error a caller sees: what could not be done where, and what to
        check (never showing the password)."""
        detail = str(exc).strip() or type(exc).__name__
        if isinstance(exc, asyncpg.exceptions.QueryCanceledError):
            detail += " (raise the statement_timeout option if this is expected)"
        if isinstance(exc, asyncpg.exceptions.InvalidPasswordError):
            detail += f"; {password_hint(self.url)}"
        if isinstance(exc, asyncpg.exceptions.InvalidCatalogNameError):
            detail += f"; {self.create_database_hint()}"
        return StorageUnavailable(f"cannot {doing} {self.where}: {detail}")

    def create_database_hint(self) -> str:
        """How to create the URL's database, which the server says does not exist
        (taskmill creates its schema and tables, not the database)."""
        p = self.parsed
        name = '"' + p.database.replace('"', '""') + '"'
        return (
            f"create it with: createdb -h {p.host} -p {p.port} -U {p.user} {p.database} "
            f'(or CREATE DATABASE {name} OWNER "{p.user}"; in psql), then run '
            f"taskmill migrate --url {redact(self.url)}"
        )

    async def connect(self) -> asyncpg.Connection[Record]:
        """A new connection outside the pool (migrations of a closed store, LISTEN),
        with the session settings; the caller closes it.

        :raises StorageUnavailable: the server cannot be reached or refused the login.
        """
        try:
            conn: asyncpg.Connection[Record] = await asyncpg.connect(
                self.parsed.dsn,
                timeout=self.options.connect_timeout,
                command_timeout=self.options.command_timeout,
                server_settings=self.server_settings(),
                statement_cache_size=0,
            )
        except (*UNAVAILABLE, asyncpg.PostgresError) as exc:
            raise self.unavailable(exc, "connect to") from exc
        return conn

    async def _create_pool(self) -> asyncpg.Pool:
        try:
            pool = await asyncpg.create_pool(
                self.parsed.dsn,
                min_size=self.options.pool_min_size,
                max_size=self.options.pool_max_size,
                timeout=self.options.connect_timeout,
                command_timeout=self.options.command_timeout,
                server_settings=self.server_settings(),
                reset=keep_session,
            )
        except (*UNAVAILABLE, asyncpg.PostgresError) as exc:
            raise self.unavailable(exc, "connect to") from exc
        assert pool is not None
        return pool

    async def start(self, prepare: Callable[[Conn], Awaitable[None]]) -> None:
        """Open the pool and run ``prepare`` (the schema check) on one of its
        connections; the pool is kept only when ``prepare`` succeeds.

        :raises StorageUnavailable: the server cannot be reached or used.
        """
        pool = await self._create_pool()
        try:
            async with pool.acquire() as conn:
                await prepare(conn)
        except BaseException as exc:
            pool.terminate()
            if isinstance(exc, (*UNAVAILABLE, asyncpg.PostgresError)):
                raise self.unavailable(exc, "prepare") from exc
            raise
        self._pool = pool

    async def stop(self) -> None:
        """Close the pool's connections. Safe to call twice."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            async with asyncio.timeout(10):
                await pool.close()
        except (*UNAVAILABLE, asyncpg.PostgresError):
            pool.terminate()

    @property
    def started(self) -> bool:
        """Whether the pool is open."""
        return self._pool is not None

    async def run(
        self,
        fn: Callable[[Conn], Awaitable[T]],
        *,
        transaction: bool = False,
    ) -> T:
        """Run ``fn`` on a pooled connection (inside a transaction when asked); run it
        again from the start after a deadlock or serialization failure (PostgreSQL
        rolled it back), at most 8 times with a growing random pause.

        :raises StorageUnavailable: the storage is not open, the server cannot be
            reached, the schema is missing a table, or the transaction kept failing.
        """
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
            except RETRYABLE as exc:
                if attempt == _ATTEMPTS - 1:
                    raise self.unavailable(exc) from exc
                await asyncio.sleep(random.uniform(0.001, 0.01) * 2**attempt)
            except MISSING as exc:
                raise StorageUnavailable(
                    f"the taskmill schema {self.options.schema} of {self.where} is missing a "
                    f"table ({exc}); create it with: taskmill migrate --url {redact(self.url)}"
                ) from exc
            except UNAVAILABLE as exc:
                raise self.unavailable(exc) from exc
        raise AssertionError("unreachable")
