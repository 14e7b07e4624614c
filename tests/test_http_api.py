"""The service's task endpoints through a real uvicorn server, on SQLite and PostgreSQL:
scoping by token, errors, limits, the OpenAPI document and the Python client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from taskmill import (
    InvalidParams,
    InvalidTaskSpec,
    InvalidTransition,
    TaskEvent,
    TaskFilter,
    Taskmill,
    TaskNotFound,
    TaskStatus,
    WaitTimeout,
)
from taskmill_http import Client, Limits, PermissionDenied, Tokens, Unauthorized, create_app
from taskmill_http.bodies import json_schema
from taskmill_http.service import TASK_ENDPOINTS

from tests.http_support import TOKENS, serve

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def tm(store_url: str) -> AsyncIterator[Taskmill]:
    async with Taskmill(store_url, plugins=False) as taskmill:
        yield taskmill


@pytest.fixture
def app(tm: Taskmill) -> Any:
    return create_app(tm, TOKENS, limits=Limits(max_body_bytes=64 * 1024, max_items=50))


@pytest.fixture
async def base_url(app: Any) -> AsyncIterator[str]:
    async with serve(app) as url:
        yield url


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        yield client


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


PHOTOS, MUSIC, ADMIN = auth("tok-photos"), auth("tok-music"), auth("tok-admin")


def error_of(response: httpx.Response) -> str:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) - {"field"} == {"code", "message"}
    code: str = body["error"]["code"]
    return code


# -- authentication ---------------------------------------------------------------------


async def test_no_token_or_an_unknown_one_is_401_on_every_endpoint(http: httpx.AsyncClient):
    for endpoint in TASK_ENDPOINTS:
        path = endpoint.path.replace("{task_id}", "x")
        for headers in ({}, auth("nope"), {"Authorization": "Basic abc"}):
            response = await http.request(endpoint.method, path, headers=headers)
            assert response.status_code == 401, (endpoint.path, headers)
            assert error_of(response) == "unauthorized"
            assert response.headers["www-authenticate"] == "Bearer"
            assert "nope" not in response.text


def test_a_tokens_file_maps_tokens_to_apps_and_admin(tmp_path: Path):
    path = tmp_path / "tokens.toml"
    path.write_text('[tokens]\n"s3cret-photos" = "photos"\n"s3cret-ops" = "*"\n')
    tokens = Tokens.from_file(path)
    assert tokens.caller("s3cret-photos").app_id == "photos"  # type: ignore[union-attr]
    assert tokens.caller("s3cret-ops").is_admin  # type: ignore[union-attr]
    assert tokens.caller("s3cret-photo") is None
    assert "s3cret" not in repr(tokens)
    path.write_text("[tokens]\nx = 1\n")
    with pytest.raises(Exception, match="app id"):
        Tokens.from_file(path)


# -- tasks --------------------------------------------------------------------------------


async def test_create_get_list_and_count_tasks_of_the_tokens_app(http: httpx.AsyncClient):
    response = await http.post(
        "/v1/tasks",
        json={"task_type": "resize", "params": {"n": 1}, "priority": 1000, "user_id": "u"},
        headers=PHOTOS,
    )
    assert response.status_code == 201, response.text
    task = response.json()
    assert task["app_id"] == "photos" and task["status"] == "pending"
    assert task["priority"] == 1000 and task["params"] == {"n": 1}
    got = await http.get(f"/v1/tasks/{task['id']}", headers=PHOTOS)
    assert got.status_code == 200 and got.json()["id"] == task["id"]

    batch = await http.post(
        "/v1/tasks:batch",
        json=[{"task_type": "resize", "params": {"n": i}} for i in range(5)],
        headers=PHOTOS,
    )
    assert batch.status_code == 201 and len(batch.json()) == 5
    listed = await http.get("/v1/tasks", params={"limit": 4}, headers=PHOTOS)
    page = listed.json()
    assert len(page["tasks"]) == 4 and page["next_cursor"]
    rest = await http.get(
        "/v1/tasks", params={"limit": 4, "cursor": page["next_cursor"]}, headers=PHOTOS
    )
    assert len(rest.json()["tasks"]) == 2 and rest.json()["next_cursor"] is None
    ids = [t["id"] for t in page["tasks"] + rest.json()["tasks"]]
    assert len(set(ids)) == 6
    summary = (await http.get("/v1/summary", headers=PHOTOS)).json()
    assert summary["total"] == 6 and summary["pending"] == 6 and summary["pct"] == 0
    filtered = await http.get(
        "/v1/tasks", params=[("status", "pending"), ("user_id", "u")], headers=PHOTOS
    )
    assert [t["id"] for t in filtered.json()["tasks"]] == [task["id"]]


async def test_cancel_children_retry_attempts_preempt_and_cancel_by_filter(
    http: httpx.AsyncClient,
):
    parent = (await http.post("/v1/tasks", json={"task_type": "p"}, headers=PHOTOS)).json()
    children = await http.post(
        f"/v1/tasks/{parent['id']}/children",
        json=[{"task_type": "c", "params": {"i": i}} for i in range(3)],
        headers=PHOTOS,
    )
    assert children.status_code == 201
    assert {c["parent_id"] for c in children.json()} == {parent["id"]}
    summary = await http.get("/v1/summary", params={"parent_id": parent["id"]}, headers=PHOTOS)
    assert summary.json()["total"] == 3
    cancelled = await http.post(
        f"/v1/tasks/{parent['id']}/cancel", json={"reason": "user"}, headers=PHOTOS
    )
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    for child in children.json():
        got = (await http.get(f"/v1/tasks/{child['id']}", headers=PHOTOS)).json()
        assert got["status"] == "cancelled"
    again = await http.post(f"/v1/tasks/{parent['id']}/retry", headers=PHOTOS)
    assert again.status_code == 200 and again.json()["status"] == "pending"
    not_failed = await http.post(f"/v1/tasks/{parent['id']}/retry", headers=PHOTOS)
    assert not_failed.status_code == 409 and error_of(not_failed) == "invalid_transition"
    attempts = await http.get(f"/v1/tasks/{parent['id']}/attempts", headers=PHOTOS)
    assert attempts.status_code == 200 and attempts.json() == []

    for key in ("a", "a", "b"):
        await http.post("/v1/tasks", json={"task_type": "sync", "dedupe_key": key}, headers=PHOTOS)
    preempted = await http.post(
        "/v1/preempt", json={"task_type": "sync", "dedupe_key": "a"}, headers=PHOTOS
    )
    assert preempted.json() == {"cancelled": 2}  # the leader and its alias
    by_filter = await http.post("/v1/tasks:cancel", json={"task_types": ["sync"]}, headers=PHOTOS)
    assert by_filter.json() == {"cancelled": 1}


async def test_suspend_resume_and_suspensions_are_scoped_to_the_app(http: httpx.AsyncClient):
    assert (await http.post("/v1/suspend", json={"task_type": "x"}, headers=PHOTOS)).json() == {
        "interrupted": 0
    }
    await http.post("/v1/suspend", headers=MUSIC)
    mine = await http.get("/v1/suspensions", headers=PHOTOS)
    assert mine.json() == [{"task_type": "x", "app_id": "photos"}]
    everything = await http.get("/v1/suspensions", headers=ADMIN)
    assert {(s["task_type"], s["app_id"]) for s in everything.json()} == {
        ("x", "photos"),
        (None, "music"),
    }
    assert (await http.post("/v1/resume", json={"task_type": "x"}, headers=PHOTOS)).json() == {
        "resumed": True
    }
    assert (await http.get("/v1/suspensions", headers=PHOTOS)).json() == []


async def test_cleanup_is_for_admin_tokens_only(http: httpx.AsyncClient, tm: Taskmill):
    task = await tm.for_app("photos").enqueue("t")
    await tm.cancel(task.id)
    refused = await http.post("/v1/cleanup", json={"older_than_seconds": 0}, headers=PHOTOS)
    assert refused.status_code == 403 and error_of(refused) == "admin_only"
    assert await tm.get(task.id) is not None
    done = await http.post("/v1/cleanup", json={"older_than_seconds": 0}, headers=ADMIN)
    assert done.json() == {"deleted": 1}


async def test_an_admin_token_sees_every_app_and_may_name_one(http: httpx.AsyncClient):
    made = await http.post("/v1/tasks", json={"task_type": "t", "app_id": "music"}, headers=ADMIN)
    assert made.status_code == 201 and made.json()["app_id"] == "music"
    await http.post("/v1/tasks", json={"task_type": "t"}, headers=PHOTOS)
    listed = (await http.get("/v1/tasks", headers=ADMIN)).json()["tasks"]
    assert {t["app_id"] for t in listed} == {"music", "photos"}
    music = (await http.get("/v1/tasks", params={"app_id": "music"}, headers=ADMIN)).json()
    assert [t["app_id"] for t in music["tasks"]] == ["music"]


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{", 400, "invalid_json"),
        (b'{"task_type": "t", "params": {"x": NaN}}', 400, "invalid_json"),
        (b'{"task_type": "t", "params": {"x": "\\ud800"}}', 400, "invalid_json"),
        (b"[]", 422, "invalid_body"),
        (b'{"task_type": 5}', 422, "invalid_body"),
        (b'{"task_type": "t", "priority": "high"}', 422, "invalid_body"),
        (b'{"task_type": "t", "priority": 99999999999999999999999}', 422, "invalid_task_spec"),
        (b'{"task_type": "t", "surprise": 1}', 422, "invalid_body"),
        (b'{"task_type": "t", "params": [1]}', 422, "invalid_body"),
        (b'{"task_type": "t", "run_at": "2030-01-01T00:00:00"}', 422, "invalid_body"),
        (b'{"task_type": "t", "delay": 1, "run_at": "2030-01-01T00:00:00Z"}', 422, None),
        (b'{"task_type": "t", "delay": 1e300}', 422, "invalid_task_spec"),
        (b'{"task_type": "t\\u0000"}', 422, "invalid_task_spec"),
        (b'{"task_type": ""}', 422, "invalid_task_spec"),
        (b'{"task_type": "t", "max_retries": -1}', 422, "invalid_task_spec"),
        (b'{"task_type": "t", "app_id": "photos"}', 422, "app_id_not_allowed"),
        (b'{"task_type": "t", "parent_id": "no-such-task"}', 404, "not_found"),
    ],
)
async def test_bad_bodies_get_json_errors_and_store_nothing(
    http: httpx.AsyncClient, tm: Taskmill, body: bytes, status: int, code: str | None
):
    response = await http.post("/v1/tasks", content=body, headers=PHOTOS)
    assert response.status_code == status, response.text
    if code is not None:
        assert error_of(response) == code
    assert await tm.query() == []


async def test_oversized_bodies_params_and_lists_are_refused(http: httpx.AsyncClient, tm: Taskmill):
    big = await http.post(
        "/v1/tasks", json={"task_type": "t", "params": {"x": "y" * 70_000}}, headers=PHOTOS
    )
    assert big.status_code == 413 and error_of(big) == "body_too_large"
    many = await http.post("/v1/tasks:batch", json=[{"task_type": "t"}] * 51, headers=PHOTOS)
    assert many.status_code == 413 and error_of(many) == "too_many_items"
    assert await tm.query() == []
    await tm.for_app("photos").enqueue_many([{"task_type": "t"}] * 60)
    page = await http.get("/v1/tasks", params={"limit": 1000}, headers=PHOTOS)
    assert len(page.json()["tasks"]) == 50 and page.json()["next_cursor"]


async def test_pages_are_keyset_so_a_cleanup_between_pages_skips_nothing(
    http: httpx.AsyncClient, tm: Taskmill
):
    photos = tm.for_app("photos")
    tasks = await photos.enqueue_many([{"task_type": "t", "params": {"n": i}} for i in range(9)])
    first = (await http.get("/v1/tasks", params={"limit": 3}, headers=PHOTOS)).json()
    assert [t["id"] for t in first["tasks"]] == [t.id for t in tasks[:3]]
    # The first page's first two tasks end and are cleaned up: an offset cursor would now
    # skip two tasks of the second page.
    for task in tasks[:2]:
        await photos.cancel(task.id)
    assert await tm.cleanup(timedelta(0)) == 2
    second = await http.get(
        "/v1/tasks", params={"limit": 3, "cursor": first["next_cursor"]}, headers=PHOTOS
    )
    assert [t["id"] for t in second.json()["tasks"]] == [t.id for t in tasks[3:6]]
    # A cursor whose anchor task was cleaned up is refused, never an empty last page.
    await photos.cancel(tasks[5].id)
    assert await tm.cleanup(timedelta(0)) == 1
    gone = await http.get(
        "/v1/tasks", params={"limit": 3, "cursor": second.json()["next_cursor"]}, headers=PHOTOS
    )
    assert gone.status_code == 410 and error_of(gone) == "cursor_expired"


@pytest.mark.parametrize(
    "params",
    [
        {"status": "sleeping"},
        {"limit": "ten"},
        {"limit": 0},
        {"cursor": "not-a-cursor"},
        {"created_after": "yesterday"},
        {"created_after": "2030-01-01T00:00:00"},
        {"task_type": "a\x00b"},
    ],
)
async def test_bad_query_parameters_are_422(http: httpx.AsyncClient, params: dict[str, Any]):
    response = await http.get("/v1/tasks", params=params, headers=PHOTOS)
    assert response.status_code == 422 and error_of(response) == "invalid_query"


async def test_unknown_paths_and_methods_answer_json(http: httpx.AsyncClient):
    missing = await http.get("/v1/nothing", headers=PHOTOS)
    assert missing.status_code == 404 and error_of(missing) == "not_found"
    wrong = await http.delete("/v1/tasks", headers=PHOTOS)
    assert wrong.status_code == 405 and error_of(wrong) == "method_not_allowed"


async def test_an_unreachable_store_is_503(http: httpx.AsyncClient, tm: Taskmill):
    await tm.storage.close()
    try:
        response = await http.get("/v1/tasks", headers=PHOTOS)
        assert response.status_code == 503 and error_of(response) == "unavailable"
    finally:
        await tm.storage.open()


# -- app isolation --------------------------------------------------------------------------


async def isolation_probes(http: httpx.AsyncClient, foreign: str) -> dict[tuple[str, str], Any]:
    """For each route, a request with the photos token that tries to reach the music
    task ``foreign``, and the statuses that prove it could not."""
    return {
        ("POST", "/v1/tasks"): ({"task_type": "t", "parent_id": foreign}, {404}),
        ("POST", "/v1/tasks:batch"): ([{"task_type": "t", "parent_id": foreign}], {404}),
        ("GET", "/v1/tasks"): ({"app_id": "music"}, {403}),
        ("GET", "/v1/tasks/{task_id}"): (None, {404}),
        ("POST", "/v1/tasks/{task_id}/cancel"): ({"reason": "user"}, {404}),
        ("POST", "/v1/tasks/{task_id}/retry"): (None, {404}),
        ("GET", "/v1/tasks/{task_id}/attempts"): (None, {404}),
        ("POST", "/v1/tasks/{task_id}/children"): ([{"task_type": "t"}], {404}),
        ("POST", "/v1/tasks:cancel"): ({"app_id": "music"}, {403}),
        ("GET", "/v1/summary"): ({"app_id": "music"}, {403}),
        ("POST", "/v1/cleanup"): ({"older_than_seconds": 0}, {403}),
        ("POST", "/v1/preempt"): ({"task_type": "t", "app_id": "music"}, {422}),
        ("POST", "/v1/suspend"): ({"app_id": "music"}, {422}),
        ("POST", "/v1/resume"): ({"app_id": "music"}, {422}),
        ("GET", "/v1/suspensions"): (None, {200}),
        ("GET", "/v1/events"): ({"app_id": "music"}, {403}),
        ("POST", "/v1/app-events"): ({"kind": "k", "app_id": "music"}, {422}),
        ("POST", "/v1/external-jobs/{job_id}/progress"): ({"done": 1}, {404}),
        ("POST", "/v1/external-jobs/{job_id}/complete"): ({"status": "failed"}, {404}),
        ("PUT", "/v1/external-jobs/{job_id}"): ({"title": "x", "app_id": "music"}, {422}),
        ("GET", "/v1/external-jobs/{job_id}"): (None, {404}),
        ("GET", "/v1/external-jobs"): (None, {200}),
        ("PUT", "/v1/handlers/{task_type}"): ({"url": "http://x", "app_id": "music"}, {422}),
        ("GET", "/v1/handlers"): (None, {200}),
        ("DELETE", "/v1/handlers/{task_type}"): ({"app_id": "music"}, {422}),
        ("POST", "/v1/tasks/{task_id}/progress"): ({"lease": "1:w", "done": 1}, {404}),
        ("POST", "/v1/tasks/{task_id}/status"): ({"lease": "1:w", "status": "failed"}, {404}),
        ("GET", "/v1/workers"): (None, {200}),
        ("GET", "/v1/metrics/timeline"): ({"app_id": "music"}, {403}),
    }


def served_endpoints(app: Any) -> list[Any]:
    """The endpoints the app serves (its route table)."""
    return list(app.state.service.endpoints)


async def test_an_app_token_reaches_no_other_apps_task_through_any_route(
    http: httpx.AsyncClient, tm: Taskmill, app: Any
):
    music = tm.for_app("music")
    foreign = await music.enqueue("t", {"secret": 1}, dedupe_key="k")
    await music.suspend("t")
    job = await http.put("/v1/external-jobs/j1", json={"title": "secret"}, headers=MUSIC)
    assert job.status_code == 200
    handler = await http.put("/v1/handlers/t", json={"url": "http://secret"}, headers=MUSIC)
    assert handler.status_code == 200
    before = await tm.get(foreign.id)
    probes = await isolation_probes(http, foreign.id)
    routes = {(e.method, e.path) for e in served_endpoints(app) if not e.public}
    assert routes == set(probes), "every route needs an isolation probe"
    for (method, path), (payload, statuses) in probes.items():
        url = path.replace("{task_id}", foreign.id).replace("{job_id}", "j1")
        url = url.replace("{task_type}", "t")
        if method in ("GET", "DELETE"):
            response = await http.request(method, url, params=payload, headers=PHOTOS)
        else:
            response = await http.request(method, url, json=payload, headers=PHOTOS)
        assert response.status_code in statuses, (method, path, response.text)
        assert "secret" not in response.text
    # Unfiltered reads and writes touch only the token's own app.
    listed = (await http.get("/v1/tasks", headers=PHOTOS)).json()["tasks"]
    assert all(t["app_id"] == "photos" for t in listed)
    assert (await http.get("/v1/summary", headers=PHOTOS)).json()["total"] == len(listed)
    cancelled = await http.post("/v1/tasks:cancel", json={"all": True}, headers=PHOTOS)
    assert cancelled.status_code == 200, cancelled.text
    await http.post("/v1/preempt", json={"task_type": "t", "dedupe_key": "k"}, headers=PHOTOS)
    suspensions = (await http.get("/v1/suspensions", headers=PHOTOS)).json()
    assert suspensions == []
    after = await tm.get(foreign.id)
    assert after == before and after is not None and after.status is TaskStatus.PENDING
    assert await tm.suspensions() != []
    assert (await http.get("/v1/external-jobs", headers=PHOTOS)).json() == []
    (theirs,) = (await http.get("/v1/external-jobs", headers=MUSIC)).json()
    assert theirs["title"] == "secret" and theirs["status"] == "running"
    assert theirs["updated_at"] == job.json()["updated_at"]
    assert (await http.get("/v1/handlers", headers=PHOTOS)).json() == []
    assert (await http.get("/v1/handlers", headers=MUSIC)).json() == [handler.json()]


# -- the OpenAPI document -------------------------------------------------------------------


async def test_the_openapi_document_describes_every_route_served(http: httpx.AsyncClient, app: Any):
    response = await http.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.1")
    served = {(e.method.lower(), e.path) for e in served_endpoints(app)}
    described = {(m, p) for p, ops in document["paths"].items() for m in ops}
    assert served == described
    for route in app.routes:
        if route.path == "/ui":  # the dashboard (HTML pages), not part of the API
            continue
        for method in route.methods - {"HEAD"}:
            assert (method.lower(), route.path) in described
    create = document["paths"]["/v1/tasks"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/TaskSpecBody"
    }
    spec = document["components"]["schemas"]["TaskSpecBody"]
    assert spec["required"] == ["task_type"] and spec["additionalProperties"] is False
    assert {"201", "401", "413", "422"} <= set(create["responses"])
    # An event's cursor is the store's opaque token, and a bad resume position a 422.
    components: dict[str, Any] = {}
    json_schema(TaskEvent, components)
    assert components["TaskEvent"]["properties"]["cursor"] == {"type": "string"}
    events = document["paths"]["/v1/events"]["get"]
    assert "422" in events["responses"]
    (since,) = [p for p in events["parameters"] if p["name"] == "since"]
    assert since["schema"]["type"] == "string"


# -- the Python client ---------------------------------------------------------------------


async def test_the_client_has_the_app_operations_and_their_exceptions(base_url: str, tm: Taskmill):
    async with Client(base_url, "tok-photos") as client:
        task = await client.enqueue("resize", {"n": 1}, user_id="u", delay=timedelta(hours=1))
        assert task.app_id == "photos" and task.status is TaskStatus.PENDING
        assert await client.get(task.id) == await tm.get(task.id)
        many = await client.enqueue_many(
            [{"task_type": "resize", "params": {"n": i}} for i in range(3)]
        )
        assert len(many) == 3
        children = await client.batch_children(task.id, [{"task_type": "child"}])
        assert children[0].parent_id == task.id
        assert len(await client.query(TaskFilter(task_types=("resize",)), limit=2)) == 2
        assert len(await client.query()) == 5
        assert (await client.progress_summary(TaskFilter(parent_id=task.id))).total == 1
        cancelled = await client.cancel(task.id)
        assert cancelled.status is TaskStatus.CANCELLED
        assert (await client.wait(task.id, timeout=1)).status is TaskStatus.CANCELLED
        assert await client.cancel_by_filter(TaskFilter(task_types=("resize",))) == 3
        assert (await client.retry(task.id)).status is TaskStatus.PENDING
        assert await client.preempt("resize") == 1
        assert await client.suspend("resize") == 0
        assert [s.task_type for s in await client.suspensions()] == ["resize"]
        assert await client.resume("resize") is True
        assert await client.attempts(task.id) == []

        foreign = await tm.for_app("music").enqueue("t")
        assert await client.get(foreign.id) is None
        with pytest.raises(TaskNotFound):
            await client.cancel(foreign.id)
        with pytest.raises(InvalidTaskSpec):
            await client.query(TaskFilter(app_id="music"))
        with pytest.raises(InvalidParams):
            await client.enqueue("t", {"x": "y" * 70_000})
        with pytest.raises(InvalidTransition):
            await client.retry((await client.enqueue("t")).id)
        with pytest.raises(PermissionDenied):
            await client.cleanup(timedelta(0))
        with pytest.raises(WaitTimeout):
            await client.wait((await client.enqueue("t")).id, timeout=0.05)
    async with Client(base_url, "wrong") as client:
        with pytest.raises(Unauthorized):
            await client.get("x")


async def test_many_concurrent_requests_are_served(base_url: str, tm: Taskmill):
    async with Client(base_url, "tok-music") as client:
        tasks = await asyncio.gather(*(client.enqueue("t", {"i": i}) for i in range(100)))
    assert len({t.id for t in tasks}) == 100
    assert (await tm.progress_summary(TaskFilter(app_id="music"))).total == 100
