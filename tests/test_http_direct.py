"""The service app sends a request for a path without parameters straight to its
endpoint (taskmill_http.service.ServiceApp), skipping Starlette's layers around the
router: which requests take that way, and that what those layers did still happens (the
answers, a 405 with ``Allow`` for a method the path does not take, HEAD, a user's
middleware, the app mounted under a prefix). Through a real uvicorn server, on SQLite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.types import Receive, Scope, Send
from taskmill import Taskmill, TaskStatus
from taskmill_http import create_app

from tests.http_support import TOKENS, serve

pytestmark = pytest.mark.timeout(60)
AUTH = {"Authorization": "Bearer tok-photos"}


@pytest.fixture
async def tm(tmp_path: Path) -> AsyncIterator[Taskmill]:
    async with Taskmill(f"sqlite:///{tmp_path / 'tasks.db'}", plugins=False) as taskmill:
        yield taskmill


async def test_direct_paths_answer_as_the_router_did(tm: Taskmill):
    app = create_app(tm, TOKENS, dashboard=False)
    through_starlette: list[str] = []
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        # Which requests go through Starlette's layers: its stack, built by the
        # lifespan's startup, wrapped to record them.
        stack = app.middleware_stack
        assert stack is not None

        async def recording(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                through_starlette.append(f"{scope['method']} {scope['path']}")
            await stack(scope, receive, send)

        app.middleware_stack = recording
        created = await http.post("/v1/tasks", json={"task_type": "resize"}, headers=AUTH)
        assert created.status_code == 201, created.text
        task_id = created.json()["id"]
        stored = await tm.get(task_id)
        assert stored is not None and stored.app_id == "photos"
        assert stored.status is TaskStatus.PENDING

        listed = await http.get("/v1/tasks", headers=AUTH)
        assert [t["id"] for t in listed.json()["tasks"]] == [task_id]
        head = await http.head("/v1/tasks", headers=AUTH)
        assert head.status_code == 200 and head.content == b""

        # A method the path does not take: Starlette's 405, with Allow.
        refused = await http.delete("/v1/tasks", headers=AUTH)
        assert refused.status_code == 405
        assert set(refused.headers["allow"].split(", ")) >= {"GET", "POST"}
        assert refused.json()["error"]["code"] == "method_not_allowed"

        # The endpoint's own errors, as before: no token, then a bad body.
        assert (await http.post("/v1/tasks", json={"task_type": "x"})).status_code == 401
        bad = await http.post("/v1/tasks", content=b"{", headers=AUTH)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"

        # Paths with parameters still go through the router.
        one = await http.get(f"/v1/tasks/{task_id}", headers=AUTH)
        assert one.status_code == 200 and one.json()["id"] == task_id
        assert (await http.get("/v1/nothing-here", headers=AUTH)).status_code == 404
    # Only the requests without an endpoint of their own path and method took the long
    # way: the creates, listings, HEAD and the endpoint's own errors went straight.
    assert through_starlette == [
        "DELETE /v1/tasks",
        f"GET /v1/tasks/{task_id}",
        "GET /v1/nothing-here",
    ]


async def test_a_users_middleware_still_sees_every_request(tm: Taskmill):
    app = create_app(tm, TOKENS, dashboard=False)
    seen: list[str] = []

    async def tag(request: Request, call_next: RequestResponseEndpoint) -> Response:
        seen.append(f"{request.method} {request.url.path}")
        response = await call_next(request)
        response.headers["X-Seen"] = "1"
        return response

    app.add_middleware(BaseHTTPMiddleware, dispatch=tag)
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        created = await http.post("/v1/tasks", json={"task_type": "resize"}, headers=AUTH)
    assert created.status_code == 201
    assert created.headers.get("x-seen") == "1"
    assert seen == ["POST /v1/tasks"]


async def test_mounted_under_a_prefix_the_app_answers_there(tm: Taskmill):
    tasks_api = create_app(tm, TOKENS, dashboard=False)
    outer = Starlette(routes=[Mount("/tasks", tasks_api)])
    async with serve(outer) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        created = await http.post("/tasks/v1/tasks", json={"task_type": "resize"}, headers=AUTH)
        assert created.status_code == 201, created.text
        assert (await tm.get(created.json()["id"])) is not None
        # The unprefixed path is the outer app's: nothing there.
        assert (await http.post("/v1/tasks", json={}, headers=AUTH)).status_code == 404
