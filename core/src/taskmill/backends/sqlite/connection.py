"""The SQLite backend's connection: one database file, one thread, one transaction
per operation.

:class:`SQLiteDatabase` owns the stdlib :mod:`sqlite3` connection and the dedicated
thread (a single-worker :class:`~concurrent.futures.ThreadPoolExecutor`) it lives on:
every operation is one synchronous function run there (:meth:`SQLiteDatabase._run`),
so one thread hop per operation, whatever its number of statements. Writes run inside
``BEGIN IMMEDIATE`` (:meth:`SQLiteDatabase._write`), which takes SQLite's writer lock
up front (waiting up to ``busy_timeout``). It checks a path before it writes anything,
so that it never creates, modifies or truncates a file that is not a taskmill database.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar
from urllib.parse import quote

from taskmill.backends.sqlite import schema
from taskmill.backends.sqlite.options import DEFAULT_BUSY_TIMEOUT
from taskmill.errors import StorageUnavailable

__all__ = ["MIN_SQLITE_VERSION", "SQLiteDatabase"]

_LOCK_RETRY_FIRST: Final = 0.0002
_LOCK_RETRY_MAX: Final = 0.002
"""The pauses between tries for a contended write lock (see ``_begin_immediate``)."""


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


T = TypeVar("T")

MIN_SQLITE_VERSION: Final = (3, 35, 0)
"""RETURNING (3.35) is what makes a claim one statement."""

_SQLITE_HEADER: Final = b"SQLite format 3\x00"


class SQLiteDatabase:
    """The database file ``path`` on its own thread; the storage's base.

    Build it with a path and its options; :meth:`open` before use, :meth:`close` after.
    """

    def __init__(
        self,
        path: str,
        *,
        url: str | None = None,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        synchronous: str = "NORMAL",
    ) -> None:
        self.path = os.path.abspath(path)
        self.url = url or f"sqlite:///{self.path}"
        self.busy_timeout = busy_timeout
        self._busy_pragma = f"PRAGMA busy_timeout = {round(busy_timeout * 1000)}"
        self.synchronous = synchronous
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None

    async def exists(self) -> bool:
        """Whether the database file exists (:meth:`open` would create it)."""
        return await asyncio.to_thread(os.path.exists, self.path)

    # -- lifecycle -------------------------------------------------------------------

    async def open(self, *, auto_migrate: bool = False) -> None:
        """Open the database file, creating it (and the schema) when it does not exist.

        An empty database gets the current schema. A database at an older schema
        version is migrated only when ``auto_migrate`` is true. Opening an open storage
        does nothing.

        :raises SchemaVersionError: the stored schema is older (without
            ``auto_migrate``; the message names ``taskmill migrate --url ...``) or newer
            than this code.
        :raises StorageUnavailable: the directory is missing or not writable, the file is
            not a SQLite database, or it is a SQLite database that is not taskmill's.
            Such a file is left untouched.
        """
        if self._executor is not None:
            return
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskmill-sqlite")
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(executor, self._open_sync, auto_migrate)
        except BaseException:
            # Also when open() itself was cancelled: the thread closes what it opened.
            executor.submit(self._close_sync)
            executor.shutdown(wait=False)
            raise
        self._executor = executor

    async def close(self) -> None:
        """Close the connection and stop the database thread. Safe to call twice;
        operations called afterwards raise :class:`StorageUnavailable`."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._close_sync)
        finally:
            executor.shutdown(wait=True)

    async def migrate(self) -> int:
        """Apply pending migrations in one ``BEGIN IMMEDIATE`` transaction and return
        the schema version now in place. Works on an open or a closed storage (the
        latter is what ``taskmill migrate`` uses on a database ``open`` refuses).

        Idempotent, and safe when several processes run it at once: the second waits
        for the first's transaction and then finds nothing to do.

        :raises SchemaVersionError: the stored schema is newer than this code.
        :raises StorageUnavailable: the file cannot be opened or is not a taskmill
            database.
        """
        if self._executor is not None:
            return await self._run(self._migrate_open)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskmill-sqlite")
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(executor, self._migrate_closed)
        finally:
            executor.shutdown(wait=True)

    # -- thread side: connections ------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """Check the path and connect, without writing anything to the file."""
        if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
            raise StorageUnavailable(
                f"taskmill's SQLite storage needs SQLite "
                f"{'.'.join(map(str, MIN_SQLITE_VERSION))} or newer; this Python uses "
                f"{sqlite3.sqlite_version}"
            )
        path = self.path
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            raise StorageUnavailable(
                f"cannot open {path}: the directory {directory} does not exist; create it "
                "first or choose another path"
            )
        if not os.access(directory, os.W_OK | os.X_OK):
            raise StorageUnavailable(
                f"cannot open {path}: the directory {directory} is not writable (SQLite "
                "keeps its -wal and -shm files next to the database)"
            )
        exists = os.path.exists(path)
        if exists:
            if not os.path.isfile(path):
                raise StorageUnavailable(f"cannot open {path}: it is not a regular file")
            try:
                with open(path, "rb") as handle:
                    header = handle.read(len(_SQLITE_HEADER))
            except OSError as exc:
                raise StorageUnavailable(f"cannot read {path}: {exc}") from exc
            if header and header != _SQLITE_HEADER:
                raise StorageUnavailable(
                    f"{path} is not a SQLite database; taskmill will not touch it. Point "
                    "the URL at a new file or an existing taskmill database"
                )
            if not os.access(path, os.W_OK):
                raise StorageUnavailable(f"cannot open {path}: the file is not writable")
        mode = "rw" if exists else "rwc"
        try:
            conn = sqlite3.connect(
                f"file:{quote(path)}?mode={mode}",
                uri=True,
                timeout=self.busy_timeout,
                isolation_level=None,
                cached_statements=512,
            )
        except sqlite3.Error as exc:
            raise StorageUnavailable(f"cannot open the SQLite database {path}: {exc}") from exc
        try:
            conn.execute(self._busy_pragma)
            schema.user_tables(conn)  # reads the header: fails on a foreign file
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StorageUnavailable(
                f"{path} is not a usable SQLite database ({exc}); taskmill will not touch it"
            ) from exc
        return conn

    def _configure(self, conn: sqlite3.Connection) -> None:
        # Switching a fresh file to WAL needs an exclusive lock, and SQLite reports a
        # busy database here without calling the busy handler: retry until the timeout.
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                mode = None
            if (mode is not None and str(mode).lower() == "wal") or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")

    def _open_sync(self, auto_migrate: bool) -> None:
        conn = self._connect()
        try:
            self._check_schema(conn, auto_migrate)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _check_schema(self, conn: sqlite3.Connection, auto_migrate: bool) -> None:
        path = self.path
        try:
            version = schema.check(conn, path, self.url, auto_migrate=auto_migrate)
            self._configure(conn)
            if version < schema.latest_version():
                schema.apply_pending(conn, path)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.IntegrityError):
                raise
            raise StorageUnavailable(f"cannot prepare the database {path}: {exc}") from exc

    def _migrate_closed(self) -> int:
        conn = self._connect()
        try:
            return self._migrate_with(conn, configure=True)
        finally:
            conn.close()

    def _migrate_open(self) -> int:
        assert self._conn is not None
        return self._migrate_with(self._conn, configure=False)

    def _migrate_with(self, conn: sqlite3.Connection, *, configure: bool) -> int:
        try:
            tables = schema.user_tables(conn)
            if tables and schema.META_TABLE not in tables:
                raise schema.SQLiteMessages(self.path).foreign(tables)
            if configure:
                self._configure(conn)
            return schema.apply_pending(conn, self.path)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.IntegrityError):
                raise
            raise StorageUnavailable(f"cannot migrate the database {self.path}: {exc}") from exc

    def _close_sync(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # -- thread side: running operations -------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the database thread (one hop) and map SQLite errors."""
        executor = self._executor
        if executor is None:
            raise StorageUnavailable(
                f"the SQLite storage {self.url} is not open; await storage.open() first"
            )
        return await asyncio.get_running_loop().run_in_executor(executor, self._guarded, fn, args)

    def _guarded(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        try:
            return fn(*args)
        except sqlite3.OperationalError as exc:
            hint = ""
            if "locked" in str(exc) or "busy" in str(exc):
                hint = (
                    f" (another process held the write lock longer than busy_timeout="
                    f"{self.busy_timeout:g}s; raise it with ?busy_timeout=SECONDS)"
                )
            raise StorageUnavailable(f"SQLite error on {self.path}: {exc}{hint}") from exc
        except sqlite3.DatabaseError as exc:
            if type(exc) is not sqlite3.DatabaseError:
                raise
            raise StorageUnavailable(f"SQLite error on {self.path}: {exc}") from exc

    def _write(self, fn: Callable[[sqlite3.Connection, Any], T], arg: Any) -> T:
        """Run ``fn(conn, arg)`` as one ``BEGIN IMMEDIATE`` transaction."""
        conn = self._conn
        if conn is None:
            raise StorageUnavailable(f"the SQLite storage {self.url} is closed")
        self._begin_immediate(conn)
        try:
            result = fn(conn, arg)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        return result

    def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE``, waiting up to ``busy_timeout`` for another connection's
        write lock by trying again every 0.2 ms, doubling to 2 ms.

        Not SQLite's own busy handler: it sleeps 1, 2, 5, 10, 15, 20, 25, 25... ms
        between tries, so a process whose writes are a millisecond long kept the others
        waiting for ten or twenty, their slots empty meanwhile (two worker processes on
        one file left a third of two cores idle; docs/benchmarks.md, "Issue 15: flow
        between claims and finishes"). The handler stays in place for every other
        statement: only this one is tried with ``busy_timeout`` 0, at the cost of two
        ``PRAGMA busy_timeout`` statements per write transaction.
        """
        deadline = time.monotonic() + self.busy_timeout
        delay = _LOCK_RETRY_FIRST
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    left = deadline - time.monotonic()
                    if not _is_busy(exc) or left <= 0:
                        raise
                time.sleep(min(delay, left))
                delay = min(delay * 2, _LOCK_RETRY_MAX)
        finally:
            conn.execute(self._busy_pragma)

    def _read(self, fn: Callable[[sqlite3.Connection, Any], T], arg: Any) -> T:
        conn = self._conn
        if conn is None:
            raise StorageUnavailable(f"the SQLite storage {self.url} is closed")
        return fn(conn, arg)
