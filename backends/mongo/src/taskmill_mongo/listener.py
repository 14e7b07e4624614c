"""Change notifications over MongoDB change streams: :class:`MongoChangeListener`.

A listener watches up to three collections, each with a change stream of its own, opened
the first time a caller waits for a kind that needs it:

============== ====================================================== =================
collection     change                                                 kind
============== ====================================================== =================
``tasks``      a task written PENDING, claimable (no ``waiting_on``,  ``WORK``
               not an alias): enqueue, retry, release, rescue, redrive
``tasks``      ``waiting_on`` removed (its last dependency ended)     ``WORK``
``tasks``      a task written RUNNING or CANCELLED with a             ``CONTROL``
               ``cancel_reason`` (a stop request, a cancel)
``suspensions`` a suspension stored                                   ``CONTROL``
``suspensions`` a suspension deleted (``resume``)                     ``WORK``
``events``     an event inserted                                      ``EVENTS``
============== ====================================================== =================

The server filters with one ``$match`` per stream, a conjunction of plain conditions
(``$in``, ``$nin``, ``$exists``) on ``operationType``, ``fullDocument`` and
``updateDescription``: on ``tasks`` it drops deletes, finishes (COMPLETED, FAILED) and
the updates that set ``lease_expires_at`` (claims and lease renewals); a ``$project``
then keeps only the fields the listener reads. The listener classifies what arrives
itself (:func:`kinds_of`), so a server that filters less (the nx-27017 stand-in
evaluates only such conjunctions and ignores ``$project``) only sends more. No
``updateLookup``: MongoDB sends ``fullDocument`` for inserts and replacements, which is
how every task transition is written, and the one update that makes a task claimable
(``$unset`` of ``waiting_on``) is recognised by its ``updateDescription``.

A stream reports a change of its kinds when it opens: a caller that looked before
(a worker claims while its listener subscribes) would otherwise miss what committed in
between. Every stream keeps its last resume token. The driver resumes once by itself after a
resumable error; when a stream still fails (the server restarted, the network failed,
the connection went silent past ``max_await + ping_interval``), the listener reopens it
with exponential backoff, resuming after its token, or from now when the server cannot
resume from it (the history was lost, the token is unknown, the collection was dropped),
and then reports a change of every kind: callers look for themselves once, whatever
the stream missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final

from pymongo import AsyncMongoClient
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.errors import OperationFailure, PyMongoError
from taskmill.errors import StorageUnavailable
from taskmill.model import TaskStatus
from taskmill.storage import ChangeListener, ChangeWaiters, StoreChange

__all__ = ["COLLECTIONS", "MongoChangeListener", "kinds_of", "pipeline_for"]

log = logging.getLogger("taskmill.mongo")

Doc = dict[str, Any]
NewClient = Callable[[], AsyncMongoClient[Doc]]
Opening = Callable[[Awaitable[AsyncChangeStream[Doc]]], Awaitable[AsyncChangeStream[Doc]]]

_PENDING: Final = TaskStatus.PENDING.value
_STOPPABLE: Final = (TaskStatus.RUNNING.value, TaskStatus.CANCELLED.value)
_FINISHED: Final = [TaskStatus.COMPLETED.value, TaskStatus.FAILED.value]
_WAITING: Final = "waiting_on"
# Server error codes after which a stream cannot resume from its token, so it starts
# afresh: ChangeStreamFatalError (280), InvalidResumeToken (260), ChangeStreamHistoryLost
# (286: the token's point left the oplog window), CappedPositionLost (136).
_NOT_RESUMABLE: Final = frozenset({280, 260, 286, 136})

COLLECTIONS: Final[Mapping[str, frozenset[StoreChange]]] = {
    "tasks": frozenset({StoreChange.WORK, StoreChange.CONTROL}),
    "suspensions": frozenset({StoreChange.WORK, StoreChange.CONTROL}),
    "events": frozenset({StoreChange.EVENTS}),
}
"""Which collections' streams can report which kinds."""


def pipeline_for(collection: str) -> list[Doc]:
    """The change-stream pipeline of ``collection``: what the server filters out."""
    if collection == "events":
        return [{"$match": {"operationType": "insert"}}, {"$project": {"operationType": 1}}]
    if collection == "suspensions":
        match: Doc = {"operationType": {"$in": ["insert", "replace", "update", "delete"]}}
        return [{"$match": match}, {"$project": {"operationType": 1}}]
    return [
        {
            "$match": {
                "operationType": {"$in": ["insert", "replace", "update"]},
                # Finishes. A missing fullDocument (an update) passes $nin.
                "fullDocument.status": {"$nin": _FINISHED},
                # Claims and lease renewals: they set lease_expires_at, nothing claimable.
                "updateDescription.updatedFields.lease_expires_at": {"$exists": False},
            }
        },
        {
            "$project": {
                "operationType": 1,
                "fullDocument.status": 1,
                "fullDocument.alias_of": 1,
                "fullDocument.cancel_reason": 1,
                f"fullDocument.{_WAITING}": 1,
                "updateDescription.removedFields": 1,
            }
        },
    ]


def kinds_of(collection: str, change: Mapping[str, Any]) -> frozenset[StoreChange]:
    """The kinds of change ``change`` (a change event of ``collection``) is."""
    op = change.get("operationType")
    if collection == "events":
        return frozenset({StoreChange.EVENTS}) if op == "insert" else frozenset()
    if collection == "suspensions":
        if op == "delete":
            return frozenset({StoreChange.WORK})
        if op in ("insert", "replace", "update"):
            return frozenset({StoreChange.CONTROL})
        return frozenset()
    if collection != "tasks" or op not in ("insert", "replace", "update"):
        return frozenset()
    doc = change.get("fullDocument")
    if isinstance(doc, Mapping):
        status = doc.get("status")
        if status == _PENDING and not doc.get(_WAITING) and doc.get("alias_of") is None:
            return frozenset({StoreChange.WORK})
        if status in _STOPPABLE and doc.get("cancel_reason") is not None:
            return frozenset({StoreChange.CONTROL})
        return frozenset()
    described = change.get("updateDescription")
    if isinstance(described, Mapping) and _WAITING in (described.get("removedFields") or ()):
        return frozenset({StoreChange.WORK})
    return frozenset()


class MongoChangeListener(ChangeListener):
    """Notifications of changes committed by any process sharing the database.

    Build it with :meth:`open` (``storage.change_listener()`` does). ``wait`` may be
    called by several coroutines at once; each sees every notification of its kinds
    that arrives after its call began.

    :param new_client: makes the listener's own client (the storage's settings); the
        listener closes it.
    :param database: the database to watch.
    :param max_await: seconds the server may hold an empty ``getMore`` (MongoDB waits
        that long for a change before answering).
    :param ping_interval: seconds past ``max_await`` after which a ``getMore`` that has
        not answered counts as a dead connection (no FIN from a crashed host).
    :param idle_pause: the least time between two ``getMore`` calls that found nothing:
        a server that answers an empty ``getMore`` at once instead of waiting (the
        nx-27017 stand-in) is asked at most this often per stream. MongoDB waits
        ``max_await``, so this never applies there.
    :param max_backoff: the longest pause between attempts to reopen a stream.
    :param opening: runs each ``watch`` command. With ``serialize_writes`` the store
        gives :func:`~taskmill_mongo.transactions.outside_transactions`: the nx-27017
        stand-in installs a collection's change triggers when its first stream opens,
        inside whatever transaction is open on its database connection, and a
        transaction that then aborts takes the triggers with it, leaving that stream
        and every later one on the collection silent.
    """

    def __init__(
        self,
        new_client: NewClient,
        database: str,
        *,
        max_await: float = 1.0,
        ping_interval: float = 5.0,
        idle_pause: float = 0.05,
        max_backoff: float = 5.0,
        opening: Opening | None = None,
    ) -> None:
        self._client = new_client()
        self._opening = opening
        self.database = database
        self.max_await = max_await
        self.ping_interval = ping_interval
        self.idle_pause = idle_pause
        self.max_backoff = max_backoff
        self._waiters = ChangeWaiters()
        self._streams: dict[str, asyncio.Task[None]] = {}
        self._tokens: dict[str, Mapping[str, Any] | None] = {}
        self._subscribing = asyncio.Lock()
        self._closed = False
        self.reconnects = 0
        """How many times a stream was reopened after it failed."""

    @classmethod
    async def open(
        cls, new_client: NewClient, database: str, **options: Any
    ) -> MongoChangeListener:
        """Reach the server (streams open with the first wait for their kinds).

        :raises StorageUnavailable: the server cannot be reached.
        """
        listener = cls(new_client, database, **options)
        try:
            await listener._client.admin.command("ping")
        except PyMongoError as exc:
            await listener._client.close()
            raise StorageUnavailable(
                f"cannot open the change-stream client on database {database!r}: {exc}"
            ) from exc
        return listener

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def watching(self) -> frozenset[str]:
        """The collections whose streams are running."""
        return frozenset(self._streams)

    async def wait(self, kinds: frozenset[StoreChange], timeout: float) -> bool:
        """Wait until a change of one of ``kinds`` is notified after this call began
        (or a stream was reopened after a failure), or ``timeout`` seconds pass.

        :returns: True when notified, False on timeout (or once closed).
        """

        async def subscribe() -> None:
            wanted = {name for name, offers in COLLECTIONS.items() if offers & kinds}
            if not wanted <= self._streams.keys():
                await self._subscribe(wanted)

        return await self._waiters.wait(kinds, timeout, subscribe)

    async def close(self) -> None:
        """Close every stream and the client (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._waiters.close()
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.cancel()
        for stream in streams:
            with contextlib.suppress(asyncio.CancelledError):
                await stream
        with contextlib.suppress(PyMongoError, TimeoutError):
            async with asyncio.timeout(5):
                await self._client.close()

    # -- internals ---------------------------------------------------------------------

    async def _subscribe(self, names: set[str]) -> None:
        """Open the streams of ``names`` not open yet, each before it is handed to its
        loop, so that a change committed after this returns is reported, and report a
        change of the kinds each opened stream serves. A stream that cannot be opened
        now is left to its loop, which retries with backoff (and reports when it
        opens)."""
        async with self._subscribing:
            for name in sorted(names - self._streams.keys()):
                if self._closed:
                    return
                try:
                    stream = await self._open_stream(name)
                except (PyMongoError, StorageUnavailable) as exc:
                    log.info("opening the change stream on %s failed (%s)", name, exc)
                    stream = None
                self._streams[name] = asyncio.create_task(
                    self._follow(name, stream), name=f"taskmill-watch-{self.database}.{name}"
                )
                if stream is not None:
                    # What committed before the stream opened is not in it, and the
                    # caller may have looked before that (a worker's first claim runs
                    # while its listener subscribes): its waiters look once more.
                    self._waiters.wake(COLLECTIONS[name])

    async def _open_stream(self, name: str) -> AsyncChangeStream[Doc]:
        token = self._tokens.get(name)
        collection = self._client[self.database][name]
        pipeline = pipeline_for(name)
        wait_ms = int(self.max_await * 1000)
        if token is not None:
            try:
                return await self._opened(
                    collection.watch(pipeline, resume_after=token, max_await_time_ms=wait_ms)
                )
            except OperationFailure as exc:
                if exc.code not in _NOT_RESUMABLE:
                    raise
                log.warning("change stream on %s cannot resume (%s); starting afresh", name, exc)
                self._tokens[name] = None
        return await self._opened(collection.watch(pipeline, max_await_time_ms=wait_ms))

    async def _opened(
        self, watch: Coroutine[Any, Any, AsyncChangeStream[Doc]]
    ) -> AsyncChangeStream[Doc]:
        if self._opening is None:
            return await watch
        try:
            return await self._opening(watch)
        finally:
            watch.close()  # never awaited when the opening failed first

    async def _follow(self, name: str, stream: AsyncChangeStream[Doc] | None) -> None:
        """Read ``name``'s stream and wake waiters; reopen it after a failure."""
        delay = 0.05
        while not self._closed:
            if stream is None:
                try:
                    stream = await self._open_stream(name)
                except (PyMongoError, StorageUnavailable) as exc:
                    log.info("reopening the change stream on %s failed (%s); retrying", name, exc)
                    await asyncio.sleep(delay)
                    delay = min(self.max_backoff, delay * 2)
                    continue
                self.reconnects += 1
                log.warning("change stream on %s.%s reopened", self.database, name)
                # What happened while it was down may be lost: every waiter looks.
                self._waiters.wake(StoreChange)
            delay = 0.05
            try:
                await self._read(name, stream)
            except (PyMongoError, TimeoutError) as exc:
                if isinstance(exc, OperationFailure) and exc.code in _NOT_RESUMABLE:
                    self._tokens[name] = None
                log.warning("change stream on %s.%s failed (%s)", self.database, name, exc)
            finally:
                with contextlib.suppress(PyMongoError, TimeoutError):
                    async with asyncio.timeout(self.ping_interval):
                        await stream.close()
            stream = None

    async def _read(self, name: str, stream: AsyncChangeStream[Doc]) -> None:
        """Follow ``stream`` until it ends (an invalidate event: the collection was
        dropped) or fails."""
        deadline = self.max_await + self.ping_interval
        first = True
        while stream.alive:
            asked = time.monotonic()
            async with asyncio.timeout(deadline):
                change = await stream.try_next()
            if first:
                # The stream's first answer: from here on the server reports to it for
                # certain. A server may fix a stream's start at its first getMore, not
                # at its opening (which already woke the waiters), and a change
                # committed in between would be in neither: its waiters look again.
                first = False
                self._waiters.wake(COLLECTIONS[name])
            token = stream.resume_token
            if change is not None and change.get("operationType") == "invalidate":
                self._tokens[name] = None  # nothing can resume after it: start afresh
                return
            if token is not None:
                self._tokens[name] = token
            if change is not None:
                kinds = kinds_of(name, change)
                if kinds:
                    self._waiters.wake(kinds)
                continue
            idle = self.idle_pause - (time.monotonic() - asked)
            if idle > 0:
                await asyncio.sleep(idle)
