"""Change notifications over LISTEN/NOTIFY: :class:`PostgresChangeListener`.

Every storage operation that makes tasks claimable, asks a running task to stop, or
writes events sends a ``pg_notify`` per kind of change in its own transaction;
PostgreSQL delivers it when (and only if) that transaction commits, once per
transaction however many rows changed. Each :class:`~taskmill.storage.StoreChange` kind
has a channel of its own (the schema's prefix plus the kind's value, e.g.
``taskmill.jobs.work``), so a worker, which waits for work and control changes, is not
sent the two event notifications every claim and finish produce.

A listener holds one dedicated connection (not one of the pool's). It LISTENs on a
kind's channel the first time it is asked to wait for that kind. When the connection
drops (the server restarted, the network failed), the listener reconnects with
exponential backoff, LISTENs again and then reports a change of every kind: whatever
was notified while it was away is lost, so callers must look for themselves once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from taskmill.errors import StorageUnavailable
from taskmill.storage import ChangeListener, ChangeWaiters, StoreChange

log = logging.getLogger("taskmill.postgres")

Connect = Callable[[], Awaitable["asyncpg.Connection[asyncpg.Record]"]]
_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


class PostgresChangeListener(ChangeListener):
    """Notifications of changes committed by any process sharing the schema.

    Build it with :meth:`open` (``storage.change_listener()`` does). ``wait`` may be
    called by several coroutines at once; each sees every notification of its kinds
    that arrives after its call began.

    :param connect: opens a new connection (the storage's settings, outside the pool).
    :param prefix: the schema's channel prefix; kind ``k`` is on ``prefix + k.value``.
    :param ping_interval: seconds between liveness checks of the connection, which find
        a connection that died silently (no FIN from a crashed host).
    :param max_backoff: the longest pause between reconnection attempts.
    """

    def __init__(
        self,
        connect: Connect,
        prefix: str,
        *,
        ping_interval: float = 5.0,
        max_backoff: float = 5.0,
    ) -> None:
        self._connect = connect
        self.prefix = prefix
        self.channels = {kind: prefix + kind.value for kind in StoreChange}
        self._kinds = {channel: kind for kind, channel in self.channels.items()}
        self.ping_interval = ping_interval
        self.max_backoff = max_backoff
        self._conn: asyncpg.Connection[asyncpg.Record] | None = None
        self._listening: set[StoreChange] = set()
        self._subscribing = asyncio.Lock()
        self._waiters = ChangeWaiters()
        self._lost = asyncio.Event()
        self._closed = False
        self._supervisor: asyncio.Task[None] | None = None
        self.reconnects = 0
        """How many times the connection was re-established after a loss."""

    @classmethod
    async def open(cls, connect: Connect, prefix: str, **options: Any) -> PostgresChangeListener:
        """Connect (LISTENing starts with the first wait for each kind).

        :raises StorageUnavailable: the server cannot be reached.
        """
        listener = cls(connect, prefix, **options)
        await listener._reconnect()
        listener._supervisor = asyncio.create_task(
            listener._supervise(), name=f"taskmill-listen-{prefix}"
        )
        return listener

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def connected(self) -> bool:
        """Whether the LISTEN connection is up right now."""
        return self._conn is not None and not self._conn.is_closed()

    async def wait(self, kinds: frozenset[StoreChange], timeout: float) -> bool:
        """Wait until a change of one of ``kinds`` is notified after this call began
        (or the listener reconnected), or ``timeout`` seconds pass. The first wait for
        a kind LISTENs on its channel before it waits: a change committed before the
        server has run that LISTEN is not reported to it, so look for work once after
        the first wait of each kind begins.

        :returns: True when notified, False on timeout (or once closed).
        """

        async def subscribe() -> None:
            missing = kinds - self._listening
            if missing:
                await self._subscribe(missing)

        return await self._waiters.wait(kinds, timeout, subscribe)

    async def close(self) -> None:
        """Stop listening and close the connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._waiters.close()
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                async with asyncio.timeout(5):
                    await conn.close()
            except _ERRORS:
                conn.terminate()

    # -- internals ---------------------------------------------------------------------

    def _on_notification(self, conn: Any, pid: int, channel: str, payload: object) -> None:
        kind = self._kinds.get(channel)
        if kind is not None:
            self._waiters.wake((kind,))

    def _on_termination(self, conn: Any) -> None:
        if conn is self._conn:
            self._lost.set()

    async def _subscribe(self, kinds: frozenset[StoreChange]) -> None:
        """LISTEN on the channels of ``kinds`` (once; a failure is left to the
        supervisor, which re-LISTENs after reconnecting)."""
        async with self._subscribing:
            conn = self._conn
            for kind in kinds - self._listening:
                if conn is None:  # the supervisor LISTENs on it once reconnected
                    self._listening.add(kind)
                    continue
                try:
                    await conn.add_listener(self.channels[kind], self._on_notification)
                except _ERRORS:
                    self._listening.add(kind)  # again, after the reconnection
                    self._lost.set()
                    return
                # Only now: a kind counts as listened to once the server has run the
                # LISTEN, so a notification committed from here on is delivered.
                self._listening.add(kind)

    async def _reconnect(self) -> None:
        try:
            conn = await self._connect()
        except StorageUnavailable:
            raise
        except _ERRORS as exc:
            raise StorageUnavailable(f"cannot open the notification connection: {exc}") from exc
        try:
            for kind in self._listening:
                await conn.add_listener(self.channels[kind], self._on_notification)
        except BaseException:
            conn.terminate()
            raise
        conn.add_termination_listener(self._on_termination)
        self._lost.clear()
        self._conn = conn

    async def _alive(self) -> bool:
        conn = self._conn
        if conn is None or conn.is_closed():
            return False
        try:
            async with self._subscribing, asyncio.timeout(self.ping_interval):
                await conn.fetchval("SELECT 1")
        except _ERRORS:
            return False
        return True

    async def _supervise(self) -> None:
        """Watch the connection; after a loss, reconnect with backoff and report."""
        while not self.closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.ping_interval):
                    await self._lost.wait()
            if self._closed:  # close() ran meanwhile (mypy narrows `self.closed` to False)
                return
            if not self._lost.is_set() and await self._alive():
                continue
            old, self._conn = self._conn, None
            if old is not None:
                old.remove_termination_listener(self._on_termination)
                old.terminate()
            log.warning("LISTEN connection on %s* lost; reconnecting", self.prefix)
            delay = 0.05
            while not self.closed:
                try:
                    async with self._subscribing:
                        await self._reconnect()
                except (StorageUnavailable, *_ERRORS) as exc:
                    log.info("reconnecting LISTEN failed (%s); retrying", exc)
                    await asyncio.sleep(delay)
                    delay = min(self.max_backoff, delay * 2)
                    continue
                self.reconnects += 1
                log.warning("LISTEN connection on %s* re-established", self.prefix)
                # What was notified meanwhile is lost: tell every waiter to look.
                self._waiters.wake(StoreChange)
                break
