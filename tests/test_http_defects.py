"""Regression tests of the service's defects found in its trial (issue 28: 1, 2, 3, 5 and
6), through a real uvicorn server: SQLite unless a defect is a backend's own."""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
from taskmill import TaskFilter, Taskmill
from taskmill.cursors import position_token, token_position
from taskmill_http import Client, Limits, create_app
from taskmill_http.routes import ENDPOINTS

from tests.http_support import TOKENS, serve

pytestmark = pytest.mark.timeout(60)

PHOTOS = {"Authorization": "Bearer tok-photos"}
MUSIC = {"Authorization": "Bearer tok-music"}
ADMIN = {"Authorization": "Bearer tok-admin"}


@pytest.fixture
async def tm(tmp_path: Path) -> AsyncIterator[Taskmill]:
    async with Taskmill(f"sqlite:///{tmp_path / 'tasks.db'}", plugins=False) as taskmill:
        yield taskmill


@pytest.fixture
async def base_url(tm: Taskmill) -> AsyncIterator[str]:
    async with serve(create_app(tm, TOKENS, limits=Limits(heartbeat_seconds=0.3))) as url:
        yield url


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        yield client


def refusal(response: httpx.Response, status: int = 422) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


async def statuses(http: httpx.AsyncClient, headers: dict[str, str]) -> dict[str, str]:
    listed = (await http.get("/v1/tasks", headers=headers)).json()["tasks"]
    return {t["task_type"]: t["status"] for t in listed}


# -- 1: a string is not a list -----------------------------------------------------------


def _list_fields(cls: Any, seen: set[Any]) -> list[tuple[type, str]]:
    """Every (class, field) of a list type in ``cls`` and the attrs classes it holds."""
    if cls in seen or not (isinstance(cls, type) and attrs.has(cls)):
        return []
    seen.add(cls)
    found: list[tuple[type, str]] = []
    hints = typing.get_type_hints(cls)
    for field in attrs.fields(cls):
        kinds = [hints[field.name], *typing.get_args(hints[field.name])]
        if any(typing.get_origin(k) is list for k in kinds):
            found.append((cls, field.name))
        for kind in kinds:
            found.extend(_list_fields(kind, seen))
    return found


def test_the_list_fields_of_every_request_body_are_the_ones_tested_below():
    seen: set[Any] = set()
    fields: set[tuple[str, str]] = set()
    for endpoint in ENDPOINTS:
        body = endpoint.body
        for cls in (body, *typing.get_args(body)):
            fields.update((c.__name__, name) for c, name in _list_fields(cls, seen))
    # A new list field must join test_a_string_for_a_list_field_is_refused_naming_it.
    assert fields == {("FilterBody", "task_types"), ("FilterBody", "statuses")}


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        pytest.param("/v1/tasks:cancel", {"task_types": "zq"}, "task_types", id="task_types"),
        pytest.param("/v1/tasks:cancel", {"statuses": "pending"}, "statuses", id="statuses"),
        pytest.param("/v1/tasks:cancel", {"task_types": {"zq": 1}}, "task_types", id="object"),
    ],
)
async def test_a_string_for_a_list_field_is_refused_naming_it(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], field: str
):
    for task_type in ("z", "q", "zq"):
        await http.post("/v1/tasks", json={"task_type": task_type}, headers=PHOTOS)
    error = refusal(await http.post(path, json=body, headers=PHOTOS))
    assert (error["code"], error["field"]) == ("invalid_body", field)
    assert await statuses(http, PHOTOS) == {"z": "pending", "q": "pending", "zq": "pending"}


async def test_a_string_for_a_list_body_is_refused(http: httpx.AsyncClient):
    parent = (await http.post("/v1/tasks", json={"task_type": "p"}, headers=PHOTOS)).json()
    for path in ("/v1/tasks:batch", f"/v1/tasks/{parent['id']}/children"):
        error = refusal(await http.post(path, json="zq", headers=PHOTOS))
        assert error["code"] == "invalid_body"
    assert await statuses(http, PHOTOS) == {"p": "pending"}


# -- 5: no bulk cancel without a filter --------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({}, id="empty"),
        pytest.param({"reason": "user", "cascade": True}, id="options-only"),
        pytest.param({"all": False}, id="all-false"),
        pytest.param({"all": True, "task_types": ["a"]}, id="all-and-a-filter"),
    ],
)
async def test_cancel_by_filter_refuses_a_body_that_selects_nothing_or_is_ambiguous(
    http: httpx.AsyncClient, body: dict[str, Any]
):
    await http.post("/v1/tasks", json={"task_type": "a"}, headers=PHOTOS)
    error = refusal(await http.post("/v1/tasks:cancel", json=body, headers=PHOTOS))
    assert (error["code"], error["field"]) == ("invalid_body", "all")
    assert await statuses(http, PHOTOS) == {"a": "pending"}


async def test_cancel_all_cancels_every_active_task_of_the_tokens_app_only(
    http: httpx.AsyncClient, base_url: str
):
    for task_type in ("a", "b"):
        await http.post("/v1/tasks", json={"task_type": task_type}, headers=PHOTOS)
    await http.post("/v1/tasks", json={"task_type": "a"}, headers=MUSIC)
    done = await http.post("/v1/tasks:cancel", json={"all": True}, headers=PHOTOS)
    assert done.status_code == 200 and done.json() == {"cancelled": 2}
    assert await statuses(http, PHOTOS) == {"a": "cancelled", "b": "cancelled"}
    assert await statuses(http, MUSIC) == {"a": "pending"}
    # The Python client keeps the in-process meaning of an empty TaskFilter.
    async with Client(base_url, "tok-music") as client:
        assert await client.cancel_by_filter(TaskFilter()) == 1
    assert await statuses(http, MUSIC) == {"a": "cancelled"}


# -- 2: resuming from ahead of the store -------------------------------------------------


@pytest.fixture
async def any_tm(store_url: str) -> AsyncIterator[Taskmill]:
    async with Taskmill(store_url, plugins=False) as taskmill:
        yield taskmill


@pytest.fixture
async def any_base_url(any_tm: Taskmill) -> AsyncIterator[str]:
    async with serve(create_app(any_tm, TOKENS)) as url:
        yield url


async def test_resuming_from_a_position_ahead_of_the_store_is_422_invalid_cursor(
    any_tm: Taskmill, any_base_url: str
):
    await any_tm.enqueue("t", app_id="photos")
    _, current = await any_tm.storage.read_events(None)
    ahead = position_token(token_position(current) + 316)
    async with httpx.AsyncClient(base_url=any_base_url, timeout=10) as http:
        for since in (f"{ahead}.1796328980395827", ahead):
            response = await http.get("/v1/events", params={"since": since}, headers=PHOTOS)
            error = refusal(response)
            assert error["code"] == "invalid_cursor" and "ahead" in error["message"]
        resumed = await http.get(
            "/v1/events", headers={**PHOTOS, "Last-Event-ID": f"{ahead}.1796328980395827"}
        )
        assert refusal(resumed)["code"] == "invalid_cursor"
        # The store's own current position is still a place to resume from.
        async with http.stream(
            "GET", "/v1/events", params={"since": f"{current}.1"}, headers=PHOTOS
        ) as good:
            assert good.status_code == 200


async def test_a_made_up_position_is_invalid_cursor_and_a_misshapen_one_invalid_query(
    http: httpx.AsyncClient,
):
    assert (
        refusal(await http.get("/v1/events", params={"since": "garbage"}, headers=PHOTOS))["code"]
        == "invalid_cursor"
    )
    assert (
        refusal(await http.get("/v1/events", params={"since": "garbage.x"}, headers=PHOTOS))["code"]
        == "invalid_query"
    )


# -- 3: external jobs end once -----------------------------------------------------------


async def test_an_external_job_in_a_final_state_refuses_completes_status_and_progress(
    http: httpx.AsyncClient,
):
    job = "/v1/external-jobs/sync-1"
    assert (await http.put(job, json={"title": "Sync"}, headers=PHOTOS)).status_code == 200
    done = await http.post(f"{job}/complete", json={"status": "completed"}, headers=PHOTOS)
    assert done.status_code == 200 and done.json()["status"] == "completed"
    for method, path, body in (
        ("POST", f"{job}/complete", {"status": "failed"}),
        ("POST", f"{job}/complete", {"status": "completed"}),
        ("PUT", job, {"status": "running"}),
        ("PUT", job, {"progress": {"done": 1}}),
        ("POST", f"{job}/progress", {"done": 5}),
    ):
        response = await http.request(method, path, json=body, headers=PHOTOS)
        assert refusal(response, 409)["code"] == "invalid_transition", (method, path, body)
    kept = (await http.get(job, headers=PHOTOS)).json()
    assert (kept["status"], kept["finished_at"]) == ("completed", done.json()["finished_at"])
    # A final job's title and data may still be corrected.
    renamed = await http.put(job, json={"title": "Synced"}, headers=PHOTOS)
    assert renamed.status_code == 200 and renamed.json()["status"] == "completed"


async def test_external_job_progress_updates_only_the_fields_it_names(http: httpx.AsyncClient):
    job = "/v1/external-jobs/sync-1"
    await http.put(job, json={"title": "Sync"}, headers=PHOTOS)
    first = {"done": 3, "total": 120, "message": "3 of 120", "eta_seconds": 60}
    assert (await http.post(f"{job}/progress", json=first, headers=PHOTOS)).status_code == 200
    step = await http.post(f"{job}/progress", json={"done": 50}, headers=PHOTOS)
    assert step.status_code == 200, step.text
    assert step.json()["progress"] == {"done": 50, "total": 120, "message": "3 of 120"}
    assert step.json()["eta_seconds"] == 60
    put = await http.put(job, json={"progress": {"message": "half"}}, headers=PHOTOS)
    assert put.json()["progress"] == {"done": 50, "total": 120, "message": "half"}
    eta = refusal(await http.post(f"{job}/progress", json={"eta_seconds": -1}, headers=PHOTOS))
    assert eta["field"] == "eta_seconds"


async def test_an_external_job_is_read_by_id_within_its_app_and_carries_its_user(
    http: httpx.AsyncClient,
):
    made = await http.put(
        "/v1/external-jobs/sync-1", json={"title": "Sync", "user_id": "u-7"}, headers=PHOTOS
    )
    assert made.json()["user_id"] == "u-7"
    got = await http.get("/v1/external-jobs/sync-1", headers=PHOTOS)
    assert got.status_code == 200 and got.json() == made.json()
    assert refusal(await http.get("/v1/external-jobs/sync-1", headers=MUSIC), 404)
    assert refusal(await http.get("/v1/external-jobs/nope", headers=PHOTOS), 404)
    long_user = {"user_id": "u" * 300}
    assert (
        refusal(await http.put("/v1/external-jobs/x", json=long_user, headers=PHOTOS))["field"]
        == "user_id"
    )


# -- 6: smaller ones ---------------------------------------------------------------------


async def test_an_unknown_query_parameter_is_refused_naming_it(http: httpx.AsyncClient):
    await http.post("/v1/tasks", json={"task_type": "a"}, headers=PHOTOS)
    for path in ("/v1/tasks", "/v1/summary", "/v1/suspensions", "/v1/events"):
        error = refusal(await http.get(path, params={"foo": "bar"}, headers=PHOTOS))
        assert (error["code"], error["field"]) == ("invalid_query", "foo"), path
    listed = await http.get("/v1/tasks", params={"task_type": "a", "limit": 5}, headers=PHOTOS)
    assert listed.status_code == 200 and len(listed.json()["tasks"]) == 1


async def test_a_negative_delay_is_refused_naming_delay(http: httpx.AsyncClient):
    error = refusal(
        await http.post("/v1/tasks", json={"task_type": "a", "delay": -5}, headers=PHOTOS)
    )
    assert error["field"] == "delay"
    assert await statuses(http, PHOTOS) == {}


async def test_every_405_answer_names_the_allowed_methods(http: httpx.AsyncClient):
    for method, path, allowed in (
        ("DELETE", "/v1/tasks", {"GET", "HEAD", "POST"}),
        ("POST", "/v1/handlers/t", {"PUT", "DELETE"}),
        ("DELETE", "/v1/external-jobs/j", {"PUT", "GET", "HEAD"}),
        ("GET", "/v1/tasks:cancel", {"POST"}),
    ):
        response = await http.request(method, path, headers=PHOTOS)
        assert refusal(response, 405)["code"] == "method_not_allowed"
        assert set(response.headers["allow"].split(", ")) == allowed, (method, path)
