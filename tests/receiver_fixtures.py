"""The ``receiver`` fixture: a real HTTP receiver for HttpHandler requests, served by
uvicorn on loopback, that records what reaches it. Loaded for every test module by
tests/conftest.py (``pytest_plugins``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.http_support import serve

TRACE_HEADERS = ("traceparent", "tracestate", "baggage")


class Receiver:
    """Answers ``POST /run`` with ``{"ran": <task id>}`` and ``POST /moved`` with a
    redirect to a metadata address; ``requests`` holds, per request, the ``host``
    header, the ``task`` sent (or ``redirected``) and its ``trace`` headers."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.base = ""

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    def app(self) -> Starlette:
        def trace(request: Request) -> dict[str, str]:
            return {n: request.headers[n] for n in TRACE_HEADERS if n in request.headers}

        async def run(request: Request) -> Response:
            body = await request.json()
            self.requests.append(
                {"host": request.headers["host"], "task": body["task"], "trace": trace(request)}
            )
            return JSONResponse({"ran": body["task"]["id"]})

        async def redirect(request: Request) -> Response:
            self.requests.append({"host": request.headers["host"], "redirected": True})
            return RedirectResponse("http://169.254.169.254/latest/meta-data/", 302)

        return Starlette(
            routes=[
                Route("/run", run, methods=["POST"]),
                Route("/moved", redirect, methods=["POST"]),
            ]
        )


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    found = Receiver()
    async with serve(found.app()) as base:
        found.base = base
        yield found
