"""Connections to the server: the pool, the session settings every connection gets,
the transaction runner that retries deadlocks, and how driver errors become taskmill's.

Every connection runs with ``time_zone = '+00:00'`` (so ``NOW(6)`` and ``DATETIME``
values are UTC), ``READ COMMITTED`` (a claim's ``SKIP LOCKED`` scan takes no gap locks
that would make claimers deadlock each other) and the ``lock_wait_timeout`` option as
``innodb_lock_wait_timeout``. A deadlock (1213) or lock wait timeout (1205) rolled the
transaction back: it is run again, a bounded number of times, from the start. A lost
connection closes that connection (the pool opens a new one on the next call) and is
reported as :class:`~taskmill.errors.StorageUnavailable`. A statement the server refuses
as larger than its ``max_allowed_packet`` (and the lost connection or broken packet
sequence that follows sending one) is the caller's
:class:`~taskmill.errors.InvalidParams`, naming the limit (see
:mod:`taskmill_mysql.packets`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, TypeVar

import aiomysql
import pymysql
import pymysql.converters
from pymysql.constants import FIELD_TYPE
from taskmill.errors import InvalidParams, StorageUnavailable

from taskmill_mysql.options import ParsedURL, redact
from taskmill_mysql.packets import (
    CHUNK,
    DEFAULT_PACKET,
    SLACK,
    Run,
    runs,
    text_bytes,
    value_ceiling,
)

__all__ = ["RETRIED", "Database", "Session", "is_unavailable"]

T = TypeVar("T")

RETRIED: Final = frozenset({1213, 1205})
"""Server errors after which the transaction was rolled back and may simply run again:
ER_LOCK_DEADLOCK and ER_LOCK_WAIT_TIMEOUT."""
DUPLICATE_KEY: Final = 1062
ACCESS_DENIED: Final = frozenset({1044, 1045, 1698})
NO_SUCH_TABLE: Final = 1146
TOO_LARGE: Final = frozenset({1153, 1301})
"""Server errors for a packet or a value over ``max_allowed_packet``:
ER_NET_PACKET_TOO_LARGE and ER_WARN_ALLOWED_PACKET_OVERFLOWED (an error in strict mode)."""
_ATTEMPTS: Final = 8


def _datetime(text: str) -> datetime | str:
    """A ``DATETIME`` column's text as a naive datetime: the C ``fromisoformat``, about
    ten times cheaper than PyMySQL's regex (a task snapshot holds up to six of them);
    anything it refuses (a zero date) goes to PyMySQL's converter as before."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        value: datetime | str = pymysql.converters.convert_datetime(text)
        return value


CONVERSIONS: Final = {
    **pymysql.converters.conversions,
    FIELD_TYPE.DATETIME: _datetime,
    FIELD_TYPE.TIMESTAMP: _datetime,
}
"""PyMySQL's conversions with the faster ``DATETIME`` decoder."""


def error_code(exc: BaseException) -> int | None:
    """The server's error number of a driver error, if it has one."""
    if isinstance(exc, pymysql.err.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means the server cannot be reached or used right now (a refused
    or lost connection, a timeout, refused credentials)."""
    if isinstance(exc, (OSError, TimeoutError, pymysql.err.InterfaceError)):
        return True
    if isinstance(exc, pymysql.err.OperationalError):
        return error_code(exc) not in RETRIED
    # The driver's own protocol errors ("Packet sequence number wrong") carry no server
    # error number: the connection is out of step and cannot be used again.
    return isinstance(exc, pymysql.err.InternalError) and error_code(exc) is None


def is_too_large(exc: BaseException, oversize: bool) -> bool:
    """Whether ``exc`` is the server refusing a packet or value over its
    ``max_allowed_packet``: its error number says so, or it is what follows sending a
    packet known to be over it (``oversize``: a lost connection, a packet sequence out
    of step)."""
    if error_code(exc) in TOO_LARGE:
        return True
    return oversize and isinstance(exc, (pymysql.err.MySQLError, OSError))


class Session:
    """One connection inside one operation: statements and their rows.

    Writes whose result the operation does not read are **deferred** (:meth:`defer`):
    rendered at once (PyMySQL's escaping) and sent together with the next statement
    whose result is needed, or with the ``COMMIT`` (:meth:`commit`), as one
    multi-statement packet (aiomysql connects with ``CLIENT.MULTI_STATEMENTS``): one
    round trip instead of one per statement. They run in order, in the same
    transaction; the server stops at the first that fails, and its error is raised
    where the packet is sent (the transaction is then rolled back, as for any error).

    No packet exceeds ``packet`` (the server's ``max_allowed_packet``): statements that
    would take the packet past it go in packets of their own first (a round trip each),
    and multi-row statements are cut (:meth:`defer_values`). Only a single statement
    over it is sent whole, to be refused; :attr:`oversize` then says so.
    """

    __slots__ = (
        "_at",
        "_at_literal",
        "_deferred",
        "_pending",
        "_sizes",
        "conn",
        "cursor",
        "oversize",
        "packet",
        "room",
    )

    def __init__(
        self, conn: aiomysql.Connection, cursor: aiomysql.Cursor, packet: int = DEFAULT_PACKET
    ) -> None:
        self.conn = conn
        self.cursor = cursor
        self.packet = packet
        """The server's ``max_allowed_packet``."""
        self.room = packet - SLACK
        """The most bytes this session puts in one packet."""
        self.oversize = False
        """Whether a packet of ``packet`` bytes or more was sent (the server refuses it)."""
        self._deferred: list[str] = []
        self._sizes: list[int] = []
        self._pending = 0
        self._at: datetime | None = None
        self._at_literal = ""

    def literal(self, value: Any) -> str:
        """``value`` as an SQL literal, as PyMySQL's ``escape`` writes it (which every
        other type goes to), with the common types done here: about three times
        cheaper than PyMySQL's dispatch, which was the largest Python cost of a bulk
        enqueue. A datetime passed again (an operation's store clock) is formatted once.
        """
        kind = type(value)
        if kind is str:
            escaped: str = self.conn.escape_string(value)
            return "'" + escaped + "'"
        if kind is int:
            return str(value)
        if value is None:
            return "NULL"
        if kind is datetime:
            if value is not self._at:
                # PyMySQL's format for a naive datetime (it drops a time zone).
                self._at_literal = (
                    f"'{value.isoformat(' ')}'"
                    if value.tzinfo is None
                    else str(self.conn.escape(value))
                )
                self._at = value
            return self._at_literal
        if kind is bool:
            return "1" if value else "0"
        return str(self.conn.escape(value))

    def render(self, sql: str, args: Sequence[Any] | Mapping[str, Any] | None) -> str:
        """``sql`` with its ``%s`` (or ``%(name)s``) placeholders filled in with the
        :meth:`literal` of each argument, as PyMySQL's ``mogrify`` does."""
        if args is None:
            return sql
        literal = self.literal
        if isinstance(args, Mapping):
            return sql % {key: literal(value) for key, value in args.items()}
        return sql % tuple([literal(value) for value in args])

    def _defer(self, text: str, size: int) -> None:
        self._deferred.append(text)
        size += 2  # the separator
        self._sizes.append(size)
        self._pending += size

    def defer(self, sql: str, args: Sequence[Any] | Mapping[str, Any] | None = None) -> None:
        """Run one statement whose result is not needed, with the next round trip."""
        text = self.render(sql, args)
        self._defer(text, text_bytes(text))

    def runs(self, fixed: int, sizes: Sequence[int], most: int = CHUNK) -> list[Run]:
        """How to cut a multi-row statement of ``fixed`` bytes besides its rows, whose
        rows take ``sizes`` bytes, into statements that each fit a packet and hold at
        most ``most`` rows (see :func:`~taskmill_mysql.packets.runs`)."""
        return runs(sizes, self.room - fixed, most)

    def value_runs(self, prefix: str, rows: Sequence[str], most: int = CHUNK) -> list[Run]:
        """How :meth:`defer_values` cuts ``rows`` into statements."""
        return self.runs(text_bytes(prefix), [text_bytes(row) + 2 for row in rows], most)

    def defer_run(self, prefix: str, rows: Sequence[str], run: Run) -> None:
        """Defer ``prefix`` followed by the rows of ``run`` (one of :meth:`value_runs`)."""
        start, stop, size = run
        self._defer(prefix + ", ".join(rows[start:stop]), text_bytes(prefix) + size)

    def defer_values(self, prefix: str, rows: Sequence[str], most: int = CHUNK) -> None:
        """Defer ``prefix`` (``INSERT ... VALUES ``) followed by ``rows`` (each one
        rendered ``(...)``), as few statements as the packet allows, each of at most
        ``most`` rows."""
        for run in self.value_runs(prefix, rows, most):
            self.defer_run(prefix, rows, run)

    def defer_rows(self, prefix: str, row: str, rows: Sequence[Sequence[Any]]) -> None:
        """Defer a multi-row ``INSERT`` (:meth:`defer_values`): ``prefix`` (``INSERT ...
        VALUES``), then ``row`` (its placeholders) filled in with each of ``rows``."""
        if rows:
            render = self.render
            self.defer_values(prefix, [render(row, r) for r in rows])

    async def _packet(self, statements: list[str], size: int) -> int:
        """Send ``statements`` (``size`` bytes) as one packet; the last one's row count."""
        if size >= self.packet - 1:
            self.oversize = True
        if len(statements) == 1:
            return int(await self.cursor.execute(statements[0]))
        await self.cursor.execute(";\n".join(statements))
        for _ in range(len(statements) - 1):
            result = await self.cursor.nextset()
            assert result, "a multi-statement packet returned fewer results than statements"
        return int(self.cursor.rowcount)

    async def _send_deferred(self) -> int:
        """Send the deferred statements, in as few packets as fit; the last one's row
        count."""
        statements, sizes, total = self._deferred, self._sizes, self._pending
        self._deferred, self._sizes, self._pending = [], [], 0
        if total <= self.room:
            return await self._packet(statements, total)
        count = 0
        for start, stop, size in runs(sizes, self.room, len(statements)):
            count = await self._packet(statements[start:stop], size)
        return count

    async def _send(self, sql: str, args: Sequence[Any] | Mapping[str, Any] | None) -> int:
        """Run the deferred statements and then ``sql``; its row count."""
        text = self.render(sql, args)
        if not self._deferred:
            return await self._packet([text], text_bytes(text))
        self._defer(text, text_bytes(text))
        return await self._send_deferred()

    async def flush(self) -> None:
        """Send the deferred statements now (without committing)."""
        if self._deferred:
            await self._send_deferred()

    def begin(self) -> None:
        """Start the transaction, with the next round trip."""
        self._defer("START TRANSACTION", 17)

    async def commit(self) -> None:
        """Commit, with the statements still deferred."""
        if self._deferred:
            await self._send("COMMIT", None)
        else:
            await self.conn.commit()

    async def execute(self, sql: str, args: Sequence[Any] | Mapping[str, Any] | None = None) -> int:
        """Run one statement; the number of rows it changed (or selected)."""
        return await self._send(sql, args)

    async def fetchall(self, sql: str, args: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run one query; its rows."""
        await self._send(sql, args)
        return list(await self.cursor.fetchall())

    async def fetchone(self, sql: str, args: Sequence[Any] | None = None) -> tuple[Any, ...] | None:
        """Run one query; its first row, or None."""
        await self._send(sql, args)
        row = await self.cursor.fetchone()
        return None if row is None else tuple(row)

    async def executemany(self, sql: str, args: Sequence[Sequence[Any]]) -> None:
        """Run ``sql`` once per row of ``args``, deferred: an ``INSERT ... VALUES (row)``
        as multi-row statements (:meth:`defer_rows`), anything else one statement
        per row."""
        prefix, values, row = sql.partition(" VALUES ")
        if values and prefix.lstrip().upper().startswith("INSERT"):
            self.defer_rows(prefix + values, row, args)
        else:
            for one in args:
                self.defer(sql, one)


def _password_hint(parsed: ParsedURL) -> str:
    if parsed.password:
        return (
            f"the server refused user {parsed.user} with the password in the URL: check the "
            "user name, the password (mysql://user:password@host/db) and that the user may "
            f"connect from this host ('{parsed.user}'@'<this host>')"
        )
    return (
        f"the URL has no password for user {parsed.user}: give one as "
        "mysql://user:password@host/db, and check that the user may connect from this host"
    )


class Database:
    """The server behind one URL: a pool of connections with taskmill's session
    settings, opened by :meth:`start` and closed by :meth:`stop`."""

    def __init__(self, parsed: ParsedURL, url: str) -> None:
        self.parsed = parsed
        self.url = url
        self.mariadb = True
        self.packet = DEFAULT_PACKET
        """The server's ``max_allowed_packet``, as :meth:`connect` read it before the
        pool opened."""
        self._pool: aiomysql.Pool | None = None

    @property
    def where(self) -> str:
        """Where the storage points, for messages: never the password."""
        return f"MySQL at {self.parsed.where}"

    def unavailable(self, exc: BaseException, doing: str = "use") -> StorageUnavailable:
        """``exc`` as the error a caller sees (never showing the password)."""
        detail = str(exc).strip() or type(exc).__name__
        if self.parsed.password:
            detail = detail.replace(self.parsed.password, "***")
        if error_code(exc) in ACCESS_DENIED:
            detail += f"; {_password_hint(self.parsed)}"
        return StorageUnavailable(f"cannot {doing} {self.where}: {detail}")

    def too_large(self, exc: BaseException) -> InvalidParams:
        """``exc``, the server refusing a statement over its ``max_allowed_packet``, as
        the error a caller sees: what was too large and what to do."""
        detail = str(exc).strip() or type(exc).__name__
        if self.parsed.password:
            detail = detail.replace(self.parsed.password, "***")
        return InvalidParams(
            f"{self.where} refused a statement over its max_allowed_packet of {self.packet} "
            f"bytes ({detail}): a value written is too large. Keep params and results "
            f"within the store's max_value_bytes ({value_ceiling(self.packet)} bytes) and "
            "a task's data well below it, storing large values elsewhere and passing a "
            "reference; or raise max_allowed_packet on the server (SET GLOBAL "
            "max_allowed_packet, and in its configuration) and open the store again",
            field=None,
        )

    def _init_command(self) -> str:
        isolation = "tx_isolation" if self.mariadb else "transaction_isolation"
        return (
            f"SET time_zone = '+00:00', {isolation} = 'READ-COMMITTED', sql_notes = 0, "
            f"innodb_lock_wait_timeout = {self.parsed.options.lock_wait_timeout}"
        )

    async def connect(self) -> aiomysql.Connection:
        """A new connection outside the pool (migrations, inspection), with the session
        settings; the caller closes it. Reads the server's kind and, while the pool is
        not open, its ``max_allowed_packet`` (:attr:`packet`) on the way.

        :raises StorageUnavailable: the server cannot be reached or refused the login.
        """
        p = self.parsed
        try:
            conn = await aiomysql.connect(
                host=p.host,
                port=p.port,
                user=p.user,
                password=p.password,
                connect_timeout=p.options.connect_timeout,
                charset=p.options.charset,
                autocommit=True,
                conv=CONVERSIONS,
            )
        except (pymysql.err.MySQLError, OSError, TimeoutError) as exc:
            raise self.unavailable(exc, "connect to") from exc
        try:
            async with conn.cursor() as cursor:
                await cursor.execute("SELECT VERSION(), @@max_allowed_packet")
                version, packet = await cursor.fetchone()
                self.mariadb = "mariadb" in str(version).lower()
                if not self.started:  # the pool's sessions keep the size read at open
                    self.packet = int(packet)
                await cursor.execute(self._init_command())
        except BaseException:
            conn.close()
            raise
        return conn

    async def start(self) -> None:
        """Open the pool (its connections get the session settings).

        :raises StorageUnavailable: the server cannot be reached.
        """
        p = self.parsed
        try:
            self._pool = await aiomysql.create_pool(
                minsize=p.options.pool_min_size,
                maxsize=p.options.pool_max_size,
                host=p.host,
                port=p.port,
                user=p.user,
                password=p.password,
                connect_timeout=p.options.connect_timeout,
                charset=p.options.charset,
                autocommit=True,
                db=p.database,
                init_command=self._init_command(),
                pool_recycle=3600,
                conv=CONVERSIONS,
            )
        except (pymysql.err.MySQLError, OSError, TimeoutError) as exc:
            raise self.unavailable(exc, "connect to") from exc

    async def stop(self) -> None:
        """Close the pool. Safe to call twice."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        pool.close()
        try:
            async with asyncio.timeout(10):
                await pool.wait_closed()
        except (TimeoutError, pymysql.err.MySQLError, OSError):
            pool.terminate()

    @property
    def started(self) -> bool:
        return self._pool is not None

    async def run(
        self,
        fn: Callable[[Session], Awaitable[T]],
        *,
        transaction: bool = True,
        retry_on: frozenset[int] = RETRIED,
    ) -> T:
        """Run ``fn`` on a pooled connection, inside one transaction unless told
        otherwise; run it again from the start after an error in ``retry_on`` (the
        server rolled it back), at most 8 times with a growing random pause.

        :raises StorageUnavailable: the storage is not open, the server cannot be
            reached, or the transaction kept failing.
        :raises InvalidParams: the server refused a statement over its
            ``max_allowed_packet`` (nothing was written).
        """
        pool = self._pool
        if pool is None:
            raise StorageUnavailable(
                f"the MySQL storage {redact(self.url)} is not open; await storage.open() first"
            )
        for attempt in range(_ATTEMPTS):
            try:
                return await self._once(pool, fn, transaction)
            except pymysql.err.MySQLError as exc:
                code = error_code(exc)
                if code in retry_on and attempt < _ATTEMPTS - 1:
                    await asyncio.sleep(random.uniform(0.001, 0.01) * 2**attempt)
                    continue
                if code in retry_on or is_unavailable(exc):
                    raise self.unavailable(exc) from exc
                if code == NO_SUCH_TABLE:
                    raise StorageUnavailable(
                        f"the taskmill database of {self.where} is missing a table ({exc}); "
                        f"create it with: taskmill migrate --url {redact(self.url)}"
                    ) from exc
                raise
            except (OSError, TimeoutError) as exc:
                raise self.unavailable(exc) from exc
        raise AssertionError("unreachable")

    async def _once(
        self, pool: aiomysql.Pool, fn: Callable[[Session], Awaitable[T]], transaction: bool
    ) -> T:
        conn = await pool.acquire()
        session: Session | None = None
        try:
            async with conn.cursor() as cursor:
                session = Session(conn, cursor, self.packet)
                if not transaction:
                    return await fn(session)
                session.begin()
                try:
                    result = await fn(session)
                    await session.commit()
                except BaseException:
                    # A connection that cannot roll back is closed (the pool drops it).
                    try:
                        await conn.rollback()
                    except BaseException:
                        conn.close()
                    raise
                return result
        except BaseException as exc:
            too_large = is_too_large(exc, session is not None and session.oversize)
            if too_large or is_unavailable(exc) or isinstance(exc, asyncio.CancelledError):
                conn.close()  # the server closes it after a packet too large
            if too_large:
                raise self.too_large(exc) from exc
            raise
        finally:
            pool.release(conn)
