"""The writer lock of ``serialize_writes``: one transaction at a time across every
process, for a server whose concurrent transactions are not isolated from each other
(nx-27017, the test stand-in, runs every client's transactions on one SQLite connection;
MongoDB does not need it).

The lock is the ``counters`` document ``_id: "writer"``: an owner and an expiry
:data:`LOCK_SECONDS` ahead that the holder renews every :data:`LOCK_RENEW` seconds while
it holds it, so that a holder that died (``kill -9``) frees it within
:data:`LOCK_SECONDS`. The coroutines of one store take turns on an in-process lock
first, so that each process polls the document from one coroutine at most, and the lock
is handed over fairly between processes (``next``: the waiter promised it next).

Each taking of the lock also counts ``turn`` up by one, in the same write: as the lock
is held by one store at a time, turns follow the order in which transactions commit,
and the holder's turn (:attr:`WriterLock.turn`) stamps the events its transaction
records (:mod:`taskmill_mongo.transactions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Final

from pymongo import ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError, PyMongoError
from taskmill.errors import StorageUnavailable

from taskmill_mongo.options import redact
from taskmill_mongo.schema import Doc

__all__ = ["LOCK_RENEW", "LOCK_SECONDS", "LOCK_WAIT", "WriterLock"]

LOCK_SECONDS: Final = 3.0
"""How long the writer lock lasts without a renewal."""
# Its holder renews it every LOCK_RENEW seconds while it holds it, so a holder that died
# (kill -9) holds the others up for at most LOCK_SECONDS (it was a fixed 30 s before).
LOCK_RENEW: Final = 0.5
LOCK_WAIT: Final = 30.0
"""How long (beyond connect_timeout) a store waits for the writer lock before giving up."""
_HOLDER: Final = f"{socket.gethostname()}:{os.getpid()}"
# How long a waiter's claim to be the writer lock's next owner lasts without a renewal
# (it renews on every poll, at most every 20 ms).
_NEXT_SECONDS: Final = 2.0


class WriterLock:
    """One store's side of the writer lock: :meth:`acquire` before a transaction (or a
    read: such a server shows other clients' uncommitted writes), :meth:`release` after,
    shielded, so that a cancelled operation still frees it."""

    def __init__(self, url: str, connect_timeout: float, now: Callable[[], Awaitable[int]]) -> None:
        """``now``: the server's clock in microseconds since the epoch."""
        self._url = url
        self._connect_timeout = connect_timeout
        self._now = now
        self._ready = False
        # The coroutines of this store queue here, so that only one of them at a time
        # polls the writer lock document (polls cost the server).
        self._local_lock: asyncio.Lock | None = None
        self._local_loop: asyncio.AbstractEventLoop | None = None
        self._renewers: dict[str, asyncio.Task[None]] = {}
        self.turn = 0
        """The turn this store took the lock at, last time (every taking counts the
        lock document's ``turn`` up by one): while the store holds the lock, greater
        than the turn of every holding before it, in any process."""

    async def release(self, db: AsyncDatabase[Doc], token: str) -> None:
        """Free the writer lock if ``token`` still holds it (shielded by callers, so a
        cancelled operation still frees it), stop renewing it, and let this store's next
        coroutine take it."""
        renewer = self._renewers.pop(token, None)
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(BaseException):
                await renewer
        try:
            await db.counters.update_one(
                {"_id": "writer", "owner": token}, {"$set": {"owner": None}}
            )
        finally:
            # Unreachable server: the lock lapses by itself within LOCK_SECONDS.
            if self._local_lock is not None and self._local_lock.locked():
                self._local_lock.release()

    async def _renew(self, db: AsyncDatabase[Doc], token: str) -> None:
        """Keep the writer lock ``token`` holds alive until :meth:`release` stops it."""
        while True:
            await asyncio.sleep(LOCK_RENEW)
            try:
                now = await self._now()
                renewed = await db.counters.update_one(
                    {"_id": "writer", "owner": token},
                    {"$set": {"until": now + int(LOCK_SECONDS * 1e6)}},
                )
            except PyMongoError:
                continue  # the server is away: the operation holding the lock fails too
            if renewed.matched_count == 0:
                return  # lost (the server lost it in a restart, say): nothing to keep

    async def acquire(self, db: AsyncDatabase[Doc]) -> str:
        """Take the writer lock; the token that holds it, for :meth:`release`.

        The coroutines of one store take turns on an in-process lock first, so that
        each process has one poller at most. The lock is handed over fairly between
        processes: a waiter that finds it taken registers as the next owner (``next``,
        kept alive while it polls), and nobody else may take the free lock before it.
        Without that, a store that locks in a tight loop (a poller, say) retakes the
        lock in the instant after each release, and a waiter polling every few
        milliseconds starves until its deadline.

        :raises StorageUnavailable: the lock stayed taken past the store's
            ``connect_timeout`` plus :data:`LOCK_WAIT`.
        """
        loop = asyncio.get_running_loop()
        if self._local_lock is None or self._local_loop is not loop:
            self._local_lock, self._local_loop = asyncio.Lock(), loop
        deadline = time.monotonic() + self._connect_timeout + LOCK_WAIT
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can time out a lock
            # it has just acquired, which would then never be released.
            async with asyncio.timeout(LOCK_WAIT):
                await self._local_lock.acquire()
        except TimeoutError:
            raise StorageUnavailable(
                f"MongoDB at {redact(self._url)}: the writer lock (serialize_writes) "
                "stayed taken; try again"
            ) from None
        try:
            token = await self._take(db, deadline)
        except BaseException:
            self._local_lock.release()
            raise
        self._renewers[token] = asyncio.create_task(self._renew(db, token))
        return token

    async def _take(self, db: AsyncDatabase[Doc], deadline: float) -> str:
        """Take the writer lock document (this store's in-process lock held)."""
        token = uuid.uuid4().hex
        delay = 0.001
        if not self._ready:
            with contextlib.suppress(DuplicateKeyError):  # created by another process
                if await db.counters.find_one({"_id": "writer"}, {"_id": 1}) is None:
                    await db.counters.insert_one(
                        {
                            "_id": "writer",
                            "owner": None,
                            "until": 0,
                            "next": None,
                            "next_until": 0,
                            "turn": 0,
                        }
                    )
            self._ready = True
        while True:
            now = await self._now()
            not_promised = {"$or": [{"next": None}, {"next": token}, {"next_until": {"$lt": now}}]}
            got = await db.counters.find_one_and_update(
                {
                    "_id": "writer",
                    "$and": [
                        {"$or": [{"owner": None}, {"until": {"$lt": now}}]},
                        not_promised,
                    ],
                },
                {
                    "$set": {
                        "owner": token,
                        "until": now + int(LOCK_SECONDS * 1e6),
                        # Who holds it (for an operator, and the chaos run's harness).
                        "holder": _HOLDER,
                        "next": None,
                        "next_until": 0,
                    },
                    "$inc": {"turn": 1},
                },
                return_document=ReturnDocument.AFTER,
            )
            if got is not None:
                self.turn = int(got["turn"])
                return token
            if time.monotonic() > deadline:
                raise StorageUnavailable(
                    f"MongoDB at {redact(self._url)}: the writer lock (serialize_writes) "
                    "stayed taken; try again"
                )
            # Queue as the next owner (or stay queued): a promise that lapses when its
            # waiter stops polling, so a waiter that died does not hold others up.
            await db.counters.update_one(
                {"_id": "writer", **not_promised},
                {"$set": {"next": token, "next_until": now + int(_NEXT_SECONDS * 1e6)}},
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)
