"""One store's way to its server: the client, the server's clock and largest document
as measured at ``open``, and the driver's errors as taskmill's.

- **The clock** is the server's: ``hello``'s ``localTime`` gives the offset of the
  server clock from this process's, measured at ``open`` and every minute after (the
  round trip's midpoint), and every timestamp written is this clock plus the offset.
- **Document size**: the same ``hello`` gives ``maxBsonObjectSize``, from which the
  store's ``max_value_bytes`` is set (:func:`~taskmill_mongo.documents.value_ceiling`);
  a write the driver or the server still refuses as too large is
  :class:`~taskmill.errors.InvalidParams`.
- Any other driver error is :class:`~taskmill.errors.StorageUnavailable`, naming the
  server without its password.
- **The fault seam** (:attr:`Connection.fault`): the transaction runner calls it at each
  :class:`Stage`, so a test can raise a driver error carrying an error label there
  (``TransientTransactionError``, ``UnknownTransactionCommitResult``), the write-conflict
  paths that no server reachable in tests produces. None (nothing called) otherwise.
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Final, TypeVar

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.common import MAX_BSON_SIZE
from pymongo.errors import (
    BulkWriteError,
    DocumentTooLarge,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)
from taskmill.errors import InvalidParams, StorageUnavailable, TaskmillError
from taskmill.storage import wall_clock

from taskmill_mongo.documents import EventKey, value_ceiling
from taskmill_mongo.options import SELECTION_PARAM, MongoOptions, redact
from taskmill_mongo.schema import Doc
from taskmill_mongo.writer_lock import WriterLock

__all__ = ["Connection", "Stage"]

T = TypeVar("T")

_CLOCK_REFRESH: Final = 60.0
_CONFIGURED_TIMEOUTS: Final = re.compile(r" \(configured timeouts: [^)]*\)")
"""What the driver adds to each connection error: the timeouts, said elsewhere."""
_TOO_LARGE: Final = frozenset({10334, 17419, 17420})
"""Server errors for a document over ``maxBsonObjectSize``: BSONObjectTooLarge, and
(older servers) an update's or an upsert's resulting document too large. An insert just
over it is refused with BadValue (2), "object to insert too large"."""


def _too_large(exc: PyMongoError) -> bool:
    """Whether the server refused a write because a document would be too large."""
    if isinstance(exc, BulkWriteError):
        errors = exc.details.get("writeErrors", [])
        return any(_too_large_error(e.get("code"), str(e.get("errmsg", ""))) for e in errors)
    return isinstance(exc, OperationFailure) and _too_large_error(exc.code, str(exc))


def _too_large_error(code: int | None, message: str) -> bool:
    return code in _TOO_LARGE or (code == 2 and "too large" in message)


class Stage(enum.Enum):
    """Where the transaction runner calls :attr:`Connection.fault`."""

    BODY = "body"
    """The body ran: its writes are made and not committed."""
    COMMIT = "commit"
    """Before each attempt to commit (a retried commit too)."""


class Connection:
    """The database one store uses once open, its clock, and its error mapping."""

    def __init__(self, options: MongoOptions) -> None:
        self.url = options.url
        self.options = options
        self.client: AsyncMongoClient[Doc] | None = None
        self.db: AsyncDatabase[Doc] | None = None
        self.offset = 0.0
        self.clock_at = 0.0
        self.max_document = MAX_BSON_SIZE
        self.writer_lock = WriterLock(options.url, options.connect_timeout, self.now)
        """Taken around every operation when ``options.serialize_writes``."""
        self.fault: Callable[[Stage], None] | None = None
        """The fault seam: called by the transaction runner at each :class:`Stage`
        (see the module docstring)."""
        self.events_closed: EventKey | None = None
        """The newest event key this store made every shard's writers pass (so that a
        later read up to it need not do it again; see
        :func:`~taskmill_mongo.transactions.read_events`)."""

    def new_client(self) -> AsyncMongoClient[Doc]:
        """A client of this store's URL and connect timeout (not connected yet)."""
        ms = int(self.options.connect_timeout * 1000)
        return AsyncMongoClient(
            self.options.driver_url,
            serverSelectionTimeoutMS=int(self.selection_timeout * 1000),
            connectTimeoutMS=ms,
            appname="taskmill",
            tz_aware=True,
        )

    def database(self) -> AsyncDatabase[Doc]:
        """The open database.

        :raises StorageUnavailable: the store is not open.
        """
        if self.db is None:
            raise StorageUnavailable(
                f"this store ({redact(self.url)}) is not open; call open() first"
            )
        return self.db

    @property
    def selection_timeout(self) -> float:
        """Seconds an operation waits for a usable server."""
        return self.options.server_selection_timeout or self.options.connect_timeout

    def unavailable(self, exc: PyMongoError) -> StorageUnavailable:
        """``exc`` as one line naming the server without its password: for a server
        that could not be selected, the first error met, not the driver's whole
        topology description."""
        message = str(exc)
        if isinstance(exc, ServerSelectionTimeoutError):
            reason = _CONFIGURED_TIMEOUTS.sub("", message.split(", Timeout: ", 1)[0])
            message = (
                f"no server answered within {self.selection_timeout:g} s ({reason}; "
                f"?{SELECTION_PARAM}=N in the URL sets how long to wait)"
            )
        message = " ".join(message.replace(self.url, redact(self.url)).split())
        return StorageUnavailable(
            f"MongoDB at {redact(self.url)} is unavailable: {message}; check that the "
            "server (a replica set member or mongos) is running and reachable"
        )

    def document_too_large(self, exc: Exception) -> InvalidParams:
        message = str(exc).replace(self.url, redact(self.url)).rstrip(".")
        return InvalidParams(
            f"MongoDB at {redact(self.url)} refused a document over its largest document "
            f"size (maxBsonObjectSize, {self.max_document} bytes): {message}. A value "
            "written is too large: keep params and results within the store's "
            f"max_value_bytes ({value_ceiling(self.max_document)} bytes) and a task's "
            "data well below it, storing large values elsewhere and passing a reference",
            field=None,
        )

    async def guard(self, work: Awaitable[T]) -> T:
        """Run ``work`` with the driver's errors mapped: a document over the server's
        size limit is :class:`~taskmill.errors.InvalidParams` (nothing was written),
        anything else :class:`~taskmill.errors.StorageUnavailable`; the driver's error
        is the cause."""
        try:
            return await work
        except TaskmillError:
            raise
        except DocumentTooLarge as exc:  # refused by the driver, before sending
            raise self.document_too_large(exc) from exc
        except PyMongoError as exc:
            if _too_large(exc):
                raise self.document_too_large(exc) from exc
            raise self.unavailable(exc) from exc

    async def sync_clock(self, db: AsyncDatabase[Doc]) -> Doc:
        """Measure the server clock's offset; the ``hello`` response it was read from."""
        before = wall_clock()
        hello = await db.client.admin.command("hello")
        after = wall_clock()
        server: datetime | None = hello.get("localTime")
        if server is not None:
            self.offset = server.timestamp() - (before + after) / 2
        self.clock_at = time.monotonic()
        return hello

    async def now(self) -> int:
        """The server's clock, in microseconds since the epoch."""
        if time.monotonic() - self.clock_at > _CLOCK_REFRESH and self.db is not None:
            await self.sync_clock(self.db)
        return int((wall_clock() + self.offset) * 1_000_000)
