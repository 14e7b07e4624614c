"""The service answers the core's refusals of a task's values as 422 naming the field, and
its OpenAPI document states the same limits (issue 25; docs/semantics.md "Limits").

Through a real uvicorn server on SQLite, PostgreSQL and MySQL, as tests/test_http_api.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from taskmill import InvalidTaskSpec, Taskmill
from taskmill.validation import (
    APP_ID_MAX,
    DEDUPE_KEY_MAX,
    DELAY_MAX,
    MAX_RETRIES_MAX,
    PRIORITY_MAX,
    PRIORITY_MIN,
    TASK_ID_MAX,
    TASK_TYPE_MAX,
    USER_ID_MAX,
)
from taskmill_http import Client, create_app

from tests.http_support import TOKENS, serve

pytestmark = pytest.mark.timeout(60)

PHOTOS = {"Authorization": "Bearer tok-photos"}
ADMIN = {"Authorization": "Bearer tok-admin"}


@pytest.fixture
async def tm(store_url: str) -> AsyncIterator[Taskmill]:
    async with Taskmill(store_url, plugins=False) as taskmill:
        yield taskmill


@pytest.fixture
async def base_url(tm: Taskmill) -> AsyncIterator[str]:
    async with serve(create_app(tm, TOKENS, dashboard=False)) as url:
        yield url


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        yield client


async def stored_ids(http: httpx.AsyncClient) -> list[str]:
    """Every stored task's id, as the admin token lists them."""
    response = await http.get("/v1/tasks", params={"limit": 1000}, headers=ADMIN)
    assert response.status_code == 200, response.text
    return [task["id"] for task in response.json()["tasks"]]


def refusal(response: httpx.Response) -> dict[str, Any]:
    """The error of a 422, which names the refused field."""
    assert response.status_code == 422, response.text
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == {"code", "message", "field"}, error
    return error


def string_of(schema: dict[str, Any]) -> dict[str, Any]:
    """The string branch of a property's schema (an optional one is a union with null)."""
    if "anyOf" in schema:
        (branch,) = [b for b in schema["anyOf"] if b.get("type") == "string"]
        return dict(branch)
    return schema


def number_of(schema: dict[str, Any]) -> dict[str, Any]:
    """The integer or number branch of a property's schema."""
    if "anyOf" in schema:
        (branch,) = [b for b in schema["anyOf"] if b.get("type") in ("integer", "number")]
        return dict(branch)
    return schema


# -- the core's refusals, answered as 422 with the field ------------------------------------

CORE_REFUSALS = [
    pytest.param({"task_type": "t" * 256}, "task_type", id="task_type-256-characters"),
    pytest.param({"task_type": "a\u0000b"}, "task_type", id="task_type-with-NUL"),
    pytest.param({"task_type": "t", "dedupe_key": "k" * 1025}, "dedupe_key", id="dedupe_key-1025"),
    pytest.param({"task_type": "t", "priority": 2**31}, "priority", id="priority-2**31"),
    pytest.param({"task_type": "t", "priority": 2**63}, "priority", id="priority-2**63"),
    pytest.param({"task_type": "t", "priority": -(2**31) - 1}, "priority", id="priority-low"),
    pytest.param({"task_type": "t", "max_retries": 2**40}, "max_retries", id="max_retries-2**40"),
    pytest.param({"task_type": "t", "delay": -5}, "delay", id="delay-negative"),
    pytest.param({"task_type": "t", "delay": 1e12}, "delay", id="delay-1e12"),
    pytest.param(
        {"task_type": "t", "run_at": "0001-01-01T00:00:00Z"}, "run_at", id="run_at-year-1"
    ),
    pytest.param({"task_type": "t", "user_id": "u" * 256}, "user_id", id="user_id-256"),
]


@pytest.mark.parametrize(("body", "field"), CORE_REFUSALS)
async def test_a_value_the_core_refuses_is_422_naming_the_field_and_stores_nothing(
    http: httpx.AsyncClient, body: dict[str, Any], field: str
):
    await http.post("/v1/tasks", json={"task_type": "seed"}, headers=PHOTOS)
    before = await stored_ids(http)
    error = refusal(await http.post("/v1/tasks", json=body, headers=PHOTOS))
    assert error["code"] == "invalid_task_spec"
    assert error["field"] == field
    assert field in error["message"]
    assert await stored_ids(http) == before


async def test_a_run_at_without_an_offset_is_422_naming_run_at_and_stores_nothing(
    http: httpx.AsyncClient,
):
    before = await stored_ids(http)
    body = {"task_type": "t", "run_at": "2030-01-01T00:00:00"}
    error = refusal(await http.post("/v1/tasks", json=body, headers=PHOTOS))
    assert error["code"] == "invalid_body" and error["field"] == "run_at"
    assert await stored_ids(http) == before


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        pytest.param("/v1/tasks", {"task_type": "t", "priority": 1.5}, "priority", id="float"),
        pytest.param("/v1/tasks", {"task_type": "t", "priority": 1e30}, "priority", id="1e30"),
        pytest.param("/v1/tasks", {"task_type": "t", "priority": "1"}, "priority", id="string"),
        pytest.param("/v1/tasks", {"task_type": "t", "max_retries": 2.0}, "max_retries", id="2.0"),
        pytest.param("/v1/tasks", {"task_type": 5}, "task_type", id="number-for-text"),
        pytest.param("/v1/tasks", {"task_type": "t", "params": "x"}, "params", id="params"),
        pytest.param("/v1/tasks", {"task_type": "t", "surprise": 1}, "surprise", id="unknown"),
        pytest.param("/v1/tasks", {"params": {}}, "task_type", id="missing"),
        pytest.param("/v1/tasks:cancel", {"task_types": "abc"}, "task_types", id="text-for-list"),
        pytest.param("/v1/tasks:cancel", {"statuses": {"a": 1}}, "statuses", id="object-for-list"),
    ],
)
async def test_a_body_field_of_the_wrong_json_type_is_422_invalid_body_naming_it(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], field: str
):
    await http.post("/v1/tasks", json={"task_type": "seed"}, headers=PHOTOS)
    before = await stored_ids(http)
    error = refusal(await http.post(path, json=body, headers=PHOTOS))
    assert error["code"] == "invalid_body" and error["field"] == field
    assert await stored_ids(http) == before
    listed = await http.get("/v1/tasks", headers=PHOTOS)
    assert [t["status"] for t in listed.json()["tasks"]] == ["pending"]  # nothing cancelled


async def test_a_refused_item_of_a_batch_or_of_children_names_the_field_and_stores_none(
    http: httpx.AsyncClient,
):
    parent = (await http.post("/v1/tasks", json={"task_type": "p"}, headers=PHOTOS)).json()
    before = await stored_ids(http)
    items = [{"task_type": "ok"}, {"task_type": "t", "priority": 2**31}]
    for path in ("/v1/tasks:batch", f"/v1/tasks/{parent['id']}/children"):
        error = refusal(await http.post(path, json=items, headers=PHOTOS))
        assert error["code"] == "invalid_task_spec" and error["field"] == "priority"
        typed = refusal(
            await http.post(path, json=[{"task_type": "t", "delay": "1"}], headers=PHOTOS)
        )
        assert typed["code"] == "invalid_body" and typed["field"] == "delay"
    assert await stored_ids(http) == before


async def test_the_service_names_the_field_of_its_own_refusals_too(http: httpx.AsyncClient):
    app_id = refusal(
        await http.post("/v1/tasks", json={"task_type": "t", "app_id": "photos"}, headers=PHOTOS)
    )
    assert app_id == {**app_id, "code": "app_id_not_allowed", "field": "app_id"}
    query = refusal(await http.get("/v1/tasks", params={"status": "sleeping"}, headers=PHOTOS))
    assert query["code"] == "invalid_query" and query["field"] == "status"
    # An error that names no field keeps the two members it always had.
    unauthorized = await http.get("/v1/tasks")
    assert unauthorized.status_code == 401
    assert set(unauthorized.json()["error"]) == {"code", "message"}


async def test_every_limit_is_admitted_up_to_its_edge_and_read_back_as_written(
    http: httpx.AsyncClient,
):
    edge = {
        "task_type": "t" * TASK_TYPE_MAX,
        "dedupe_key": "k" * DEDUPE_KEY_MAX,
        "user_id": "u" * USER_ID_MAX,
        "priority": PRIORITY_MAX,
        "max_retries": MAX_RETRIES_MAX,
        "delay": 0,
    }
    made = await http.post("/v1/tasks", json=edge, headers=PHOTOS)
    assert made.status_code == 201, made.text
    task = made.json()
    assert {k: task[k] for k in edge if k != "delay"} == {
        k: v for k, v in edge.items() if k != "delay"
    }
    low = await http.post(
        "/v1/tasks",
        json={"task_type": "t", "priority": PRIORITY_MIN, "run_at": "1970-01-01T00:00:00Z"},
        headers=PHOTOS,
    )
    assert low.status_code == 201, low.text
    assert low.json()["priority"] == PRIORITY_MIN
    assert low.json()["run_at"].startswith("1970-01-01T00:00:00")
    admin = await http.post(
        "/v1/tasks", json={"task_type": "t", "app_id": "a" * APP_ID_MAX}, headers=ADMIN
    )
    assert admin.status_code == 201 and admin.json()["app_id"] == "a" * APP_ID_MAX
    too_long = await http.post(
        "/v1/tasks", json={"task_type": "t", "app_id": "a" * (APP_ID_MAX + 1)}, headers=ADMIN
    )
    assert refusal(too_long)["field"] == "app_id"


# -- the OpenAPI document states the same limits --------------------------------------------


async def test_the_openapi_document_states_the_limits_of_a_task_spec(http: httpx.AsyncClient):
    document = (await http.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]
    spec = schemas["TaskSpecBody"]["properties"]
    task_type = string_of(spec["task_type"])
    assert task_type["maxLength"] == 255 == TASK_TYPE_MAX and task_type["minLength"] == 1
    assert string_of(spec["dedupe_key"])["maxLength"] == 1024 == DEDUPE_KEY_MAX
    assert string_of(spec["app_id"])["maxLength"] == APP_ID_MAX
    assert string_of(spec["user_id"])["maxLength"] == USER_ID_MAX
    assert string_of(spec["parent_id"])["maxLength"] == TASK_ID_MAX
    priority = number_of(spec["priority"])
    assert priority == {
        "type": "integer",
        "format": "int32",
        "minimum": PRIORITY_MIN,
        "maximum": PRIORITY_MAX,
    }
    max_retries = number_of(spec["max_retries"])
    assert (max_retries["minimum"], max_retries["maximum"]) == (0, MAX_RETRIES_MAX)
    delay = number_of(spec["delay"])
    assert delay["minimum"] == 0 and delay["maximum"] == DELAY_MAX
    assert "1970-01-01" in spec["run_at"]["description"]
    # The error body names the refused field; it is left out when there is none.
    detail = schemas["ErrorDetail"]
    assert string_of(detail["properties"]["field"]) == {"type": "string"}
    assert detail["required"] == ["code", "message"]
    # The filters and paths take keys as long as the core keeps them.
    listing = {p["name"]: p for p in document["paths"]["/v1/tasks"]["get"]["parameters"]}
    assert listing["dedupe_key"]["schema"]["maxLength"] == DEDUPE_KEY_MAX
    assert listing["task_type"]["schema"]["items"]["maxLength"] == TASK_TYPE_MAX
    (task_id,) = document["paths"]["/v1/tasks/{task_id}"]["get"]["parameters"]
    assert task_id["schema"]["maxLength"] == TASK_ID_MAX


# -- the Python client ----------------------------------------------------------------------


async def test_the_client_raises_invalid_task_spec_with_the_field(base_url: str, tm: Taskmill):
    async with Client(base_url, "tok-photos") as client:
        with pytest.raises(InvalidTaskSpec) as too_long:
            await client.enqueue("t" * 256)
        assert too_long.value.field == "task_type"
        with pytest.raises(InvalidTaskSpec) as priority:
            await client.enqueue_many([{"task_type": "t", "priority": 2**31}])
        assert priority.value.field == "priority"
    assert await tm.query() == []
