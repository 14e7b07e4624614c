"""The HTTP handler's client (taskmill_http.transport) against real servers on loopback:
kept-alive connections, the framings of an answer, a stale connection, cancellation,
and headers that would break a request. The handler's protocol on top of it is tested in
tests/test_http_proxy.py and tests/test_http_allowlist.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from taskmill_http.handler import HttpHandler
from taskmill_http.transport import (
    ConnectFailed,
    ProtocolFailed,
    Transport,
    check_header,
)

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]
"""Writes the answer to one request (its body given); returns whether to keep the
connection open for the next."""


class Server:
    """An HTTP/1.1 server on loopback that counts connections and requests."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed = asyncio.Event()
        self.server: asyncio.Server | None = None

    @property
    def origin(self) -> tuple[str, str, int, None]:
        assert self.server is not None
        return ("http", "127.0.0.1", self.server.sockets[0].getsockname()[1], None)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                if not await self.answer(body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.closed.set()


@contextlib.asynccontextmanager
async def serving(answer: Answer) -> AsyncIterator[Server]:
    server = Server(answer)
    server.server = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    try:
        yield server
    finally:
        server.server.close()


async def ok(body: bytes, writer: asyncio.StreamWriter) -> bool:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode())
    writer.write(b"\r\nContent-Type: application/json\r\n\r\n" + body)
    await writer.drain()
    return True


async def post(transport: Transport, server: Server, body: bytes = b"{}") -> tuple[int, bytes]:
    response = await transport.post(
        server.origin, "/run?x=1", "127.0.0.1", body, {"Content-Type": "application/json"}
    )
    return response.status, response.content


async def test_requests_reuse_one_kept_alive_connection():
    transport = Transport()
    async with serving(ok) as server:
        for n in range(20):
            assert await post(transport, server, b'{"n": %d}' % n) == (200, b'{"n": %d}' % n)
        assert server.connections == 1
        request = server.requests[0]
        assert request.startswith(b"POST /run?x=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert b"Content-Length: 8\r\n" in request
    await transport.aclose()


async def test_concurrent_requests_open_a_connection_each_then_share_them():
    transport = Transport()
    async with serving(ok) as server:
        await asyncio.gather(*(post(transport, server) for _ in range(5)))
        assert server.connections == 5
        for _ in range(3):
            await asyncio.gather(*(post(transport, server) for _ in range(5)))
        assert server.connections == 5
    await transport.aclose()


async def test_a_chunked_answer_and_one_delimited_by_the_close_are_read_whole():
    async def chunked(body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"3\r\n[1,\r\n2\r\n2]\r\n0\r\n\r\n")
        await writer.drain()
        return True

    async def until_close(body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
        writer.write(b'{"whole": true}')
        await writer.drain()
        return False  # the body ends with the connection

    transport = Transport()
    async with serving(chunked) as server:
        assert await post(transport, server) == (200, b"[1,2]")
        assert await post(transport, server) == (200, b"[1,2]")
        assert server.connections == 1
    async with serving(until_close) as server:
        assert await post(transport, server) == (200, b'{"whole": true}')
        assert await post(transport, server) == (200, b'{"whole": true}')
        assert server.connections == 2  # a connection that ended the answer is not reused
    await transport.aclose()


async def test_connection_close_is_honoured():
    async def closing(body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 503 Busy\r\nConnection: close\r\nContent-Length: 4\r\n\r\nbusy")
        await writer.drain()
        return True  # the server would even keep it: the client must not

    transport = Transport()
    async with serving(closing) as server:
        assert await post(transport, server) == (503, b"busy")
        assert await post(transport, server) == (503, b"busy")
        assert server.connections == 2
    await transport.aclose()


async def test_a_kept_connection_the_server_closed_is_not_used_again():
    async def once(body: bytes, writer: asyncio.StreamWriter) -> bool:
        await ok(body, writer)
        return False  # closes after answering, without saying so

    transport = Transport()
    async with serving(once) as server:
        assert await post(transport, server) == (200, b"{}")
        await asyncio.wait_for(server.closed.wait(), 5)
        # The request goes out on a new connection (the closed one is dropped before
        # use, or the request is sent again when the close is noticed only then).
        assert await post(transport, server, b"[2]") == (200, b"[2]")
        assert server.connections == 2
        assert len(server.requests) == 2
    await transport.aclose()


async def test_an_answer_cut_off_is_a_protocol_failure_and_the_connection_dropped():
    async def cut(body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        return False

    transport = Transport()
    async with serving(cut) as server:
        with pytest.raises(ProtocolFailed, match="middle of the answer"):
            await post(transport, server)
        assert len(server.requests) == 1  # not sent again: the server had answered
    await transport.aclose()


async def test_garbage_is_a_protocol_failure():
    async def garbage(body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        return False

    transport = Transport()
    async with serving(garbage) as server:
        with pytest.raises(ProtocolFailed, match="not HTTP"):
            await post(transport, server)
    await transport.aclose()


async def test_nothing_listening_is_a_connect_failure():
    async with serving(ok) as server:
        origin = server.origin
    transport = Transport(connect_timeout=2)
    with pytest.raises(ConnectFailed):
        await transport.post(origin, "/", "127.0.0.1", b"{}", {})


async def test_a_cancelled_request_closes_its_connection():
    started = asyncio.Event()

    async def hang(body: bytes, writer: asyncio.StreamWriter) -> bool:
        if started.is_set():
            return await ok(body, writer)
        started.set()
        return True  # no answer: the server waits for the next request on the connection

    transport = Transport()
    async with serving(hang) as server:
        request = asyncio.create_task(post(transport, server))
        await asyncio.wait_for(started.wait(), 5)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        # The server's read of the next request sees the connection closed.
        await asyncio.wait_for(server.closed.wait(), 5)
        assert await asyncio.wait_for(post(transport, server), 5) == (200, b"{}")
        assert server.connections == 2  # the cancelled request's connection was not reused
    await transport.aclose()


def test_headers_that_would_break_a_request_are_refused():
    check_header("Authorization", "Bearer abc")
    for name, value in [
        ("X-Evil", "a\r\nHost: elsewhere"),
        ("X-Evil", "a\nb"),
        ("Bad Name", "x"),
        ("X-Name:", "x"),
        ("", "x"),
        ("X-Unicode", "naïve ✓"),
    ]:
        with pytest.raises(ValueError, match=r"control character|header name|Latin-1"):
            check_header(name, value)
    with pytest.raises(ValueError, match="control character"):
        HttpHandler("http://127.0.0.1:9/run", headers={"X-Evil": "a\r\nb: c"})
    with pytest.raises(ValueError, match="sets the Host header itself"):
        HttpHandler("http://127.0.0.1:9/run", headers={"Host": "elsewhere"})
