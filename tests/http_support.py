"""Real uvicorn servers on free loopback ports for the service tests (tests/test_http_*)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import uvicorn

TOKENS = {
    "tok-photos": "photos",
    "tok-music": "music",
    "tok-admin": "*",
}
"""The tokens every service test serves: two apps and an admin."""


def loopback_socket() -> socket.socket:
    """A listening TCP socket on a free loopback port."""
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say so, and
    # without it every keep-alive request waits out a delayed ACK (40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    return sock


@contextlib.asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in this event loop; yields
    its base URL and stops the server (waiting for it) on exit."""
    sock = loopback_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    running = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_for(lambda: server.started or running.done(), timeout=10)
        if running.done():
            running.result()
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await running
        sock.close()


async def wait_for(
    condition: Callable[[], bool | Awaitable[bool]], *, timeout: float = 10.0
) -> None:
    """Wait until ``condition()`` holds, checking every 10 ms; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.01)
