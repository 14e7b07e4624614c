"""The limits the OpenAPI document gained (issue 28 item 6), each checked both ways on
the live service: a value the document admits is taken, one it refuses is a 4xx, and
the figure in the document is the one the server uses (tests/test_http_schemathesis.py
runs Schemathesis' positive and negative checks over every operation; these pin the
cases it found, deterministically)."""

from __future__ import annotations

import base64
import ipaddress
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from taskmill import Taskmill
from taskmill_http import create_app
from taskmill_http.bodies import HANDLER_URL, SECONDS_MAX
from taskmill_http.requests import CURSOR, CURSOR_MAX, encode_cursor

from tests.http_support import TOKENS, serve

pytestmark = pytest.mark.timeout(60)

PHOTOS = {"Authorization": "Bearer tok-photos"}
ADMIN = {"Authorization": "Bearer tok-admin"}


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with Taskmill(f"sqlite:///{tmp_path / 'tasks.db'}", plugins=False) as tm:
        app = create_app(tm, TOKENS, dashboard=False)
        async with serve(app) as base, httpx.AsyncClient(base_url=base, timeout=10) as client:
            yield client


@pytest.fixture
async def document(http: httpx.AsyncClient) -> dict[str, Any]:
    found: dict[str, Any] = (await http.get("/openapi.json")).json()
    return found


def body_schema(document: dict[str, Any], name: str) -> dict[str, Any]:
    schema: dict[str, Any] = document["components"]["schemas"][name]
    return schema


def branch(schema: dict[str, Any], kind: str) -> dict[str, Any]:
    for one in schema.get("anyOf", [schema]):
        if one.get("type") == kind:
            return dict(one)
    raise AssertionError(f"no {kind} in {schema}")


def parameter(document: dict[str, Any], path: str, name: str) -> dict[str, Any]:
    (found,) = [p for p in document["paths"][path]["get"]["parameters"] if p["name"] == name]
    return dict(found["schema"])


def error(response: httpx.Response, status: int = 422) -> dict[str, Any]:
    assert response.status_code == status, response.text
    found: dict[str, Any] = response.json()["error"]
    return found


async def test_a_service_checked_number_is_taken_up_to_the_documented_bound(
    http: httpx.AsyncClient, document: dict[str, Any]
):
    older = body_schema(document, "CleanupBody")["properties"]["older_than_seconds"]
    assert (older["minimum"], older["maximum"]) == (0, SECONDS_MAX)
    edge = await http.post("/v1/cleanup", json={"older_than_seconds": SECONDS_MAX}, headers=ADMIN)
    assert edge.status_code == 200, edge.text
    past = await http.post(
        "/v1/cleanup", json={"older_than_seconds": SECONDS_MAX * 1.001}, headers=ADMIN
    )
    assert (error(past)["code"], error(past)["field"]) == ("invalid_body", "older_than_seconds")
    concurrency = branch(
        body_schema(document, "HandlerBody")["properties"]["concurrency"], "integer"
    )
    url = "http://127.0.0.1:9/run"
    top = concurrency["maximum"]
    assert (
        await http.put("/v1/handlers/t", json={"url": url, "concurrency": top}, headers=PHOTOS)
    ).status_code == 200
    over = await http.put(
        "/v1/handlers/t", json={"url": url, "concurrency": top + 1}, headers=PHOTOS
    )
    assert error(over)["field"] == "concurrency"


async def test_an_external_jobs_progress_states_its_ranges(
    http: httpx.AsyncClient, document: dict[str, Any]
):
    total = branch(body_schema(document, "ProgressBody")["properties"]["total"], "number")
    assert total["exclusiveMinimum"] == 0
    job = {"progress": {"done": 1, "total": 0}}
    zero = await http.put("/v1/external-jobs/j", json=job, headers=PHOTOS)
    assert error(zero)["field"] == "total"
    assert (
        await http.put("/v1/external-jobs/j", json={"progress": {"total": 0.5}}, headers=PHOTOS)
    ).status_code == 200


async def test_an_optional_body_is_left_out_or_an_object_never_null(http: httpx.AsyncClient):
    assert (await http.post("/v1/suspend", headers=PHOTOS)).status_code == 200
    for path in ("/v1/suspend", "/v1/resume"):
        null = await http.post(path, content=b"null", headers=PHOTOS)
        assert error(null)["code"] == "invalid_body"


async def test_a_lease_of_the_wrong_shape_is_a_422_not_a_500(http: httpx.AsyncClient):
    task = (await http.post("/v1/tasks", json={"task_type": "t"}, headers=PHOTOS)).json()
    for lease in ("\u00b2:worker", "1:", ":w", "1234567890:w", "x"):
        refused = await http.post(
            f"/v1/tasks/{task['id']}/progress", json={"lease": lease}, headers=PHOTOS
        )
        assert error(refused)["field"] == "lease", lease
    # A lease of the right shape that this task does not hold: 409, about the task's state.
    lost = await http.post(
        f"/v1/tasks/{task['id']}/progress", json={"lease": "1:w"}, headers=PHOTOS
    )
    assert error(lost, 409)["code"] == "lease_lost"


async def test_a_cursors_shape_is_documented_and_any_text_of_it_names_a_task(
    http: httpx.AsyncClient, document: dict[str, Any]
):
    cursor = parameter(document, "/v1/tasks", "cursor")
    assert cursor["maxLength"] == CURSOR_MAX
    shape = re.compile(cursor["pattern"])
    for task_id in ("1", "a" * 64, "\U0001f600" * 64, "f00d-\u00e9"):
        made = encode_cursor(task_id)
        assert shape.fullmatch(made) and len(made) <= CURSOR_MAX, task_id
    for bad in ("not-a-cursor", "a", "aw", "az" + "A" * 3):  # 5 characters: 6 bits over
        assert shape.fullmatch(bad) is None, bad
        refused = await http.get("/v1/tasks", params={"cursor": bad}, headers=PHOTOS)
        assert error(refused)["code"] == "invalid_query", bad
    unknown = base64.urlsafe_b64encode(b"k\xff\xfe-no-such-task").decode().rstrip("=")
    assert shape.fullmatch(unknown)
    gone = await http.get("/v1/tasks", params={"cursor": unknown}, headers=PHOTOS)
    assert error(gone, 410)["code"] == "cursor_expired"


async def test_status_takes_statuses_and_commas_and_nothing_else(
    http: httpx.AsyncClient, document: dict[str, Any]
):
    items = re.compile(parameter(document, "/v1/tasks", "status")["items"]["pattern"])
    for value in ("pending", "pending,running", "failed,cancelled,completed"):
        assert items.fullmatch(value)
        listed = await http.get("/v1/tasks", params={"status": value}, headers=PHOTOS)
        assert listed.status_code == 200, value
    for value in ("", "pending,", "pending,,running", "sleeping"):
        assert items.fullmatch(value) is None
        refused = await http.get("/v1/tasks", params={"status": value}, headers=PHOTOS)
        assert error(refused)["field"] == "status", value


async def test_an_integer_parameter_is_ascii_digits(http: httpx.AsyncClient):
    assert (await http.get("/v1/tasks", params={"limit": "5"}, headers=PHOTOS)).status_code == 200
    for limit in ("+5", " 5", "\u0665", "5.0", "0"):
        refused = await http.get("/v1/tasks", params={"limit": limit}, headers=PHOTOS)
        assert error(refused)["field"] == "limit", limit


async def test_cancel_by_filter_states_all_or_a_filter(
    http: httpx.AsyncClient, document: dict[str, Any]
):
    schema = body_schema(document, "FilterBody")
    every, filtered = schema["anyOf"]
    assert every["properties"]["all"] == {"const": True}
    assert filtered["properties"]["all"] == {"const": False}
    selecting = {one["required"][0] for one in filtered["anyOf"]}
    assert "task_types" in selecting and not {"all", "reason", "cascade"} & selecting
    assert (
        await http.post("/v1/tasks:cancel", json={"all": True, "task_types": None}, headers=PHOTOS)
    ).status_code == 200
    for body in ({}, {"all": True, "task_types": ["a"]}, {"reason": "user"}):
        refused = await http.post("/v1/tasks:cancel", json=body, headers=PHOTOS)
        assert error(refused)["field"] == "all", body


async def test_a_child_names_no_other_parent_in_the_document(
    http: httpx.AsyncClient, document: dict[str, Any]
):
    child = body_schema(document, "ChildSpecBody")["properties"]["parent_id"]
    assert child["type"] == "null"
    parent = (await http.post("/v1/tasks", json={"task_type": "p"}, headers=PHOTOS)).json()
    same = [{"task_type": "c", "parent_id": parent["id"]}]
    made = await http.post(f"/v1/tasks/{parent['id']}/children", json=same, headers=PHOTOS)
    assert made.status_code == 201  # the path's own id is still taken
    run_at_and_delay = {"task_type": "t", "run_at": "2030-01-01T00:00:00Z", "delay": 5}
    assert "not" in body_schema(document, "TaskSpecBody")
    assert (
        error(await http.post("/v1/tasks", json=run_at_and_delay, headers=PHOTOS))["field"]
        == "delay"
    )


@given(st.from_regex(HANDLER_URL, fullmatch=True))
@settings(max_examples=300, deadline=None)
def test_every_url_of_the_documented_shape_is_read_by_httpx_with_the_host_as_written(url: str):
    written = url.split("://", 1)[1]
    host = re.split(r"[/?#]", written, maxsplit=1)[0]
    if host.startswith("["):
        host = host[1 : host.index("]")]
    else:
        host = host.rsplit(":", 1)[0] if ":" in host else host
    parsed = httpx.URL(url)  # never InvalidURL
    assert parsed.raw_host.decode("ascii") == host.lower() or ipaddress.ip_address(
        parsed.raw_host.decode("ascii")
    ) == ipaddress.ip_address(host)


@given(st.from_regex(CURSOR, fullmatch=True).filter(lambda c: len(c) <= CURSOR_MAX))
@settings(max_examples=300, deadline=None)
def test_every_cursor_of_the_documented_shape_decodes_to_a_task_id(cursor: str):
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    assert raw[:1] == b"k"
    assert isinstance(raw[1:].decode("utf-8", "replace"), str)
