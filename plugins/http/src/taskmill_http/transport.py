"""``Transport``: the HTTP/1.1 client an :class:`~taskmill_http.handler.HttpHandler`
POSTs its tasks with: keep-alive connections per origin, on asyncio streams, with the
answer parsed by ``httptools`` (uvicorn's C parser, already installed with the service).

A worker calls its HTTP handlers once per task, so the cost per request is a worker's
cost per task. httpx spent about 1 ms of CPU per call there (its pool checks every idle
connection for readability before each request, and its async primitives ask which event
loop runs on every lock and event); this client does what a handler needs and no more:

- ``POST`` with a ``Content-Length`` body; the answer's status, headers and whole body
  (``Content-Length``, chunked, or until the connection closes);
- connections kept alive per (scheme, address, port, TLS server name), the most recently
  used first, at most :data:`MAX_IDLE` idle ones an origin, each dropped after
  :data:`IDLE_SECONDS` idle (Node's and many servers' keep-alive lasts 5 s) or when the
  peer closed it; a request sent on a reused connection that the peer closed before
  answering a single byte is sent once more on a new connection (the server never read
  it);
- redirects are answers like any other (the handler does not follow them); no proxies,
  no cookies, no environment;
- a request cancelled (timeout, cancel, shutdown) closes its connection, so the receiver
  sees the connection closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Mapping
from typing import Final

import attrs
import httptools

__all__ = [
    "ConnectFailed",
    "ConnectTimeout",
    "HttpResponse",
    "ProtocolFailed",
    "Transport",
    "TransportFailed",
]

MAX_IDLE: Final = 64
"""Idle connections kept per origin."""
IDLE_SECONDS: Final = 4.0
"""An idle connection older than this is closed rather than reused (under the 5 s
keep-alive of Node and of many servers, so a reuse does not race the peer's close)."""
_READ: Final = 65536


class TransportFailed(Exception):
    """The request got no complete answer (see the subclasses)."""


class ConnectFailed(TransportFailed):
    """No connection could be made (refused, unreachable, a name that does not
    resolve, a TLS handshake that failed)."""


class ConnectTimeout(ConnectFailed):
    """Connecting took longer than the connect timeout."""


class ProtocolFailed(TransportFailed):
    """The connection broke, or the answer was not HTTP/1.x, before it was complete."""


@attrs.frozen
class HttpResponse:
    """A complete answer."""

    status: int
    headers: Mapping[str, str]
    """Names in lower case; a repeated header keeps its last value."""
    content: bytes

    @property
    def text(self) -> str:
        """The body as text (UTF-8, undecodable bytes replaced)."""
        return self.content.decode("utf-8", "replace")


def check_header(name: str, value: str) -> None:
    """Refuse a header that would break the request: no control characters (a CR or
    LF would start another header), Latin-1 only (what HTTP/1.1 carries)."""
    for text in (name, value):
        if any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in text):
            raise ValueError(f"HTTP header {name!r} holds a control character")
        try:
            text.encode("latin-1")
        except UnicodeEncodeError:
            raise ValueError(f"HTTP header {name!r} is not Latin-1 text") from None
    if not name or any(c in name for c in ' \t:()<>@,;\\"/[]?={}'):
        raise ValueError(f"{name!r} is not an HTTP header name")


class _Answer:
    """httptools' callbacks, gathering one answer."""

    __slots__ = ("body", "complete", "headers", "headers_complete", "started")

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.complete = False
        self.started = False
        self.headers_complete = False

    def on_message_begin(self) -> None:
        self.started = True

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_complete = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


@attrs.define(eq=False)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0

    def usable(self, now: float) -> bool:
        """Still open, nothing unread, and not idle for too long."""
        return (
            not self.writer.is_closing()
            and not self.reader.at_eof()
            and not getattr(self.reader, "_buffer", b"")  # data nobody asked for
            and now - self.idle_since < IDLE_SECONDS
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


Origin = tuple[str, str, int, str | None]
"""(scheme, the address or name connected to, port, the TLS server name)."""


class Transport:
    """Keep-alive HTTP/1.1 connections, per origin, for one event loop.

    :param connect_timeout: seconds to connect (TLS handshake included).
    """

    def __init__(self, *, connect_timeout: float = 10.0) -> None:
        self.connect_timeout = connect_timeout
        self._idle: dict[Origin, list[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(
        self,
        origin: Origin,
        target: str,
        host_header: str,
        body: bytes,
        headers: Mapping[str, str],
    ) -> HttpResponse:
        """``POST target`` to ``origin`` with ``body``; the whole answer.

        :raises ConnectFailed: no connection could be made.
        :raises ProtocolFailed: the answer broke off or was not HTTP/1.x.
        """
        head = [f"POST {target} HTTP/1.1\r\nHost: {host_header}\r\n"]
        head += [f"{name}: {value}\r\n" for name, value in headers.items()]
        head.append(f"Content-Length: {len(body)}\r\n\r\n")
        request = "".join(head).encode("latin-1") + body
        connection, reused = await self._connection(origin)
        try:
            answer = await self._exchange(connection, request)
        except _NotAnswered:
            connection.close()
            if not reused:
                raise ProtocolFailed("the connection closed before an answer") from None
            # The peer closed a kept-alive connection before reading the request: send
            # it once more, on a connection of its own.
            connection, _ = await self._connection(origin, fresh=True)
            try:
                answer = await self._exchange(connection, request)
            except _NotAnswered:
                connection.close()
                raise ProtocolFailed("the connection closed before an answer") from None
            except BaseException:
                connection.close()
                raise
        except BaseException:
            connection.close()  # cancelled or broken: the receiver sees it closed
            raise
        response, keep = answer
        if keep:
            self._release(origin, connection)
        else:
            connection.close()
        return response

    async def _exchange(self, connection: _Connection, request: bytes) -> tuple[HttpResponse, bool]:
        answer = _Answer()
        parser = httptools.HttpResponseParser(answer)
        try:
            connection.writer.write(request)
            await connection.writer.drain()
            while not answer.complete:
                data = await connection.reader.read(_READ)
                if not data:
                    if not answer.started:
                        raise _NotAnswered
                    if _delimited_by_close(answer):
                        answer.complete = True  # the body ends with the connection
                        return _response(parser, answer), False
                    raise ProtocolFailed("the connection closed in the middle of the answer")
                parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise ProtocolFailed(f"the answer is not HTTP/1.x: {exc}") from None
        except (ConnectionError, OSError) as exc:
            if not answer.started:
                raise _NotAnswered from None
            raise ProtocolFailed(f"{type(exc).__name__}: {exc}") from None
        return _response(parser, answer), _keeps_alive(parser, answer)

    async def _connection(self, origin: Origin, *, fresh: bool = False) -> tuple[_Connection, bool]:
        """An idle connection to ``origin`` (the most recent usable one), else a new
        one; and whether it was reused."""
        if not fresh:
            idle = self._idle.get(origin)
            now = time.monotonic()
            while idle:
                connection = idle.pop()
                if connection.usable(now):
                    return connection, True
                connection.close()
        return await self._connect(origin), False

    async def _connect(self, origin: Origin) -> _Connection:
        scheme, host, port, server_name = origin
        tls = None
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(
                    host,
                    port,
                    ssl=tls,
                    server_hostname=(server_name or host) if tls is not None else None,
                    limit=_READ,
                )
        except TimeoutError:
            raise ConnectTimeout(
                f"no connection to {host} port {port} within {self.connect_timeout} s"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from None
        return _Connection(reader, writer)

    def _release(self, origin: Origin, connection: _Connection) -> None:
        idle = self._idle.setdefault(origin, [])
        if len(idle) >= MAX_IDLE:
            idle.pop(0).close()  # the least recently used
        connection.idle_since = time.monotonic()
        idle.append(connection)

    async def aclose(self) -> None:
        """Close every idle connection (a request in flight keeps its own; a new
        request opens new ones)."""
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()


class _NotAnswered(Exception):
    """Not a byte of an answer came before the connection closed."""


def _delimited_by_close(answer: _Answer) -> bool:
    """An answer with neither a length nor chunks: its body runs to the connection's
    close (HTTP/1.1, section 6.3)."""
    headers = answer.headers
    return (
        answer.headers_complete
        and "content-length" not in headers
        and "transfer-encoding" not in headers
    )


def _keeps_alive(parser: httptools.HttpResponseParser, answer: _Answer) -> bool:
    """Whether the connection may carry another request (httptools' own answer is
    reset once the message completes): HTTP/1.1 unless ``Connection: close``, HTTP/1.0
    only with ``Connection: keep-alive``."""
    connection = answer.headers.get("connection", "").lower()
    if parser.get_http_version() == "1.1":
        return "close" not in connection
    return "keep-alive" in connection


def _response(parser: httptools.HttpResponseParser, answer: _Answer) -> HttpResponse:
    return HttpResponse(
        status=parser.get_status_code(),
        headers=answer.headers,
        content=b"".join(answer.body),
    )
