"""A TCP fault proxy on loopback, between a store and its database server.

The proxy forwards bytes both ways between each accepted client connection and one new
connection to the server, and injects the faults of the network-fault tests on command:

- :meth:`FaultProxy.drop_all` aborts every live connection (an RST both ways);
- :attr:`FaultProxy.latency` delays every chunk, both ways;
- :meth:`FaultProxy.black_hole` stops forwarding (and accepting) for a while: bytes are
  held, as TCP holds and retransmits them, and flow again when the hole closes;
- :attr:`FaultProxy.refusing` closes new connections at once (the server "is down");
- :meth:`FaultProxy.cut_reply` arms a cut in the middle of a commit: the first client
  chunk that matches is forwarded to the server, the server's reply is swallowed (up to
  the chunk that ends it) and both sides are aborted, so the client never learns whether
  its commit was applied, though the server applied it.

It is a test tool, not a product module: it lives in the test suite and only ever
listens on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Final

import attrs

CHUNK: Final = 65536

Matcher = Callable[[bytes], bool]


def contains(*needles: bytes) -> Matcher:
    """A matcher: the chunk holds every one of ``needles`` (case-insensitive)."""
    lowered = [n.lower() for n in needles]

    def match(chunk: bytes) -> bool:
        low = chunk.lower()
        return all(n in low for n in lowered)

    return match


def anything(chunk: bytes) -> bool:
    """A matcher for any chunk."""
    return True


_EXECUTE: Final = b"E\x00\x00\x00\x09\x00"


def postgres_execution_of(fragment: bytes) -> Matcher:
    """A matcher of the PostgreSQL client chunk that executes (and, in autocommit,
    commits) the statement whose text holds ``fragment``.

    asyncpg prepares a named statement (a ``Parse`` message with the text) and then
    runs it by name (``Bind`` + ``Execute`` + ``Sync``, one chunk): the matcher learns
    the names from the ``Parse`` messages it sees and matches the first execution.
    """
    names: set[bytes] = set()

    def match(chunk: bytes) -> bool:
        if chunk[:1] == b"P" and fragment in chunk:
            names.add(chunk[5 : chunk.index(b"\x00", 5)])
            return False
        if chunk[:1] == b"B" and _EXECUTE in chunk:
            portal_end = chunk.index(b"\x00", 5)
            name = chunk[portal_end + 1 : chunk.index(b"\x00", portal_end + 1)]
            return name in names
        return False

    return match


POSTGRES_COMMIT: Final = contains(b"COMMIT")
"""A PostgreSQL client chunk that commits an explicit transaction."""
POSTGRES_READY: Final = contains(b"Z\x00\x00\x00\x05")
"""A PostgreSQL server chunk that ends a reply (``ReadyForQuery``): the commit is done."""
MYSQL_COMMIT: Final = contains(b"COMMIT")
"""A MySQL client chunk that commits (``COM_QUERY COMMIT``)."""


def _lenenc_end(payload: bytes, at: int) -> int:
    """Where the MySQL length-encoded integer at ``at`` ends."""
    first = payload[at]
    return at + {0xFC: 3, 0xFD: 4, 0xFE: 9}.get(first, 1)


def mysql_reply_done(chunk: bytes) -> bool:
    """A MySQL server chunk whose last packet ends the reply: an error, or an OK without
    ``SERVER_MORE_RESULTS_EXISTS``. A multi-statement query (the backend sends deferred
    writes with its ``COMMIT``) gets one OK per statement, and the transaction is
    committed only when the last one is sent: cutting at the first OK would abort it."""
    at, done = 0, False
    while at + 4 <= len(chunk):
        length = int.from_bytes(chunk[at : at + 3], "little")
        payload = chunk[at + 4 : at + 4 + length]
        if len(payload) < length:
            break
        if payload[:1] == b"\xff":
            done = True
        elif payload[:1] in (b"\x00", b"\xfe") and len(payload) >= 5:
            flags_at = _lenenc_end(payload, _lenenc_end(payload, 1))
            flags = int.from_bytes(payload[flags_at : flags_at + 2], "little")
            done = not flags & 0x0008
        else:
            done = False
        at += 4 + length
    return done


_OP_MSG: Final = (2013).to_bytes(4, "little")


def mongo_command(name: bytes) -> Matcher:
    """A matcher of the MongoDB client chunk that sends the command ``name``: an
    ``OP_MSG`` (opcode 2013 at bytes 12-16 of the header) whose body document's first
    element, right after the flag bits and the section kind 0, is named ``name``."""
    # header (16) + flagBits (4) + section kind (1) + document length (4) + element type (1)
    prefix = 16 + 4 + 1 + 4 + 1

    def match(chunk: bytes) -> bool:
        return (
            len(chunk) > prefix + len(name)
            and chunk[12:16] == _OP_MSG
            and chunk[20] == 0
            and chunk[prefix : prefix + len(name) + 1] == name + b"\x00"
        )

    return match


MONGO_COMMIT: Final = mongo_command(b"commitTransaction")
"""A MongoDB client chunk that commits a transaction (the ``commitTransaction`` command;
the reply is one ``OP_MSG``)."""


@attrs.define
class _Cut:
    request: Matcher
    reply_ends: Matcher
    done: asyncio.Event = attrs.field(factory=asyncio.Event)


@attrs.define(eq=False)
class _Link:
    """One client connection and its server connection."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    swallowing: _Cut | None = None

    def abort(self) -> None:
        for writer in (self.client, self.server):
            transport = writer.transport
            if not transport.is_closing():
                transport.abort()


class FaultProxy:
    """A loopback TCP proxy to ``target_host:target_port`` with injectable faults.

    Use it as ``async with FaultProxy(host, port) as proxy:`` and point the store at
    ``127.0.0.1:proxy.port``.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.latency = 0.0
        """Seconds added before each forwarded chunk, both ways."""
        self.refusing = False
        """While True, new client connections are closed at once."""
        self.connections_accepted = 0
        self.connections_dropped = 0
        self.cuts_done = 0
        self._open = asyncio.Event()
        self._open.set()
        self._links: set[_Link] = set()
        self._cut: _Cut | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The port the proxy listens on (127.0.0.1)."""
        assert self._server is not None, "the proxy is not started"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._open.set()
        if self._server is not None:
            self._server.close()
        self.drop_all()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    # -- faults ----------------------------------------------------------------------------

    @property
    def live_connections(self) -> int:
        """How many client connections are being forwarded now."""
        return len(self._links)

    def drop_all(self) -> int:
        """Abort every live connection, both sides; how many were dropped."""
        links = list(self._links)
        for link in links:
            link.abort()
        self._links.difference_update(links)
        self.connections_dropped += len(links)
        return len(links)

    def hole_open(self) -> None:
        """Stop forwarding: bytes are held (not lost) until :meth:`hole_close`."""
        self._open.clear()

    def hole_close(self) -> None:
        """Forward again, the held bytes first."""
        self._open.set()

    @contextlib.asynccontextmanager
    async def black_hole(self) -> AsyncIterator[None]:
        """Black-hole the traffic inside the ``async with`` block."""
        self.hole_open()
        try:
            yield
        finally:
            self.hole_close()

    def cut_reply(self, request: Matcher, reply_ends: Matcher = anything) -> asyncio.Event:
        """Arm a cut in the middle of a commit (one shot).

        The first client chunk that ``request`` matches is forwarded; the server's reply
        is swallowed up to the chunk that ``reply_ends`` matches, then both sides of that
        connection are aborted. The returned event is set once the cut is done.
        """
        self._cut = _Cut(request, reply_ends)
        return self._cut.done

    # -- forwarding ------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            self._tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        await self._open.wait()
        if self.refusing:
            writer.transport.abort()
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(
                self.target_host, self.target_port
            )
        except OSError:
            writer.transport.abort()
            return
        link = _Link(writer, server_writer)
        self._links.add(link)
        upstream = asyncio.create_task(self._pump(reader, link, to_server=True))
        downstream = asyncio.create_task(self._pump(server_reader, link, to_server=False))
        try:
            await asyncio.wait({upstream, downstream}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (upstream, downstream):
                task.cancel()
            for task in (upstream, downstream):
                with contextlib.suppress(BaseException):
                    await task
            link.abort()
            self._links.discard(link)

    async def _pump(self, reader: asyncio.StreamReader, link: _Link, *, to_server: bool) -> None:
        out = link.server if to_server else link.client
        while True:
            try:
                chunk = await reader.read(CHUNK)
            except OSError:
                return
            if not chunk:
                with contextlib.suppress(OSError):
                    out.write_eof()
                return
            await self._open.wait()
            if self.latency:
                await asyncio.sleep(self.latency)
            if to_server:
                cut = self._cut
                if cut is not None and cut.request(chunk):
                    self._cut = None
                    link.swallowing = cut
            elif link.swallowing is not None:
                cut = link.swallowing
                if cut.reply_ends(chunk):
                    link.abort()
                    self._links.discard(link)
                    self.connections_dropped += 1
                    self.cuts_done += 1
                    cut.done.set()
                    return
                continue
            try:
                out.write(chunk)
                await out.drain()
            except OSError:
                return
