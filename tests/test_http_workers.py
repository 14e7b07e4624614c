"""``GET /v1/workers``: the registered workers as ``taskmill workers --json`` and the
dashboard's workers page show them, scoped by token, through a real uvicorn server with
a real worker process, on SQLite and PostgreSQL (docs/service.md, "Workers")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from taskmill import Taskmill
from taskmill.workers import WorkerHandler, WorkerRecord, record_json
from taskmill_http import create_app

from tests.http_support import TOKENS, serve, wait_for
from tests.test_dashboard import worker_process

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tasks.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
async def taskmill(url: str) -> AsyncIterator[Taskmill]:
    async with Taskmill(url, plugins=False) as tm:
        yield tm


@pytest.fixture
async def http(taskmill: Taskmill) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serve(create_app(taskmill, TOKENS)) as base,
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        yield client


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def workers(http: httpx.AsyncClient, token: str) -> dict[str, dict[str, Any]]:
    response = await http.get("/v1/workers", headers=auth(token))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["registry"] is True
    return {w["id"]: w for w in body["workers"]}


async def put_record(tm: Taskmill, worker_id: str, app_id: str, lease: float) -> None:
    """A registration of a worker (of no process here) serving only ``app_id``'s
    ``encode``."""
    record = WorkerRecord(
        id=worker_id,
        host="music-box",
        pid=1,
        version="9.9",
        started_at=datetime.now(UTC),
        lease_seconds=lease,
        concurrency=2,
        busy=0,
        handlers=(
            WorkerHandler(task_type="encode", app_id=app_id, max_retries=2),
            WorkerHandler(task_type="taskmill.group"),
        ),
    )
    await tm.storage.put_worker(record.id, record_json(record))


async def test_workers_are_listed_per_token_with_their_running_tasks(
    taskmill: Taskmill, http: httpx.AsyncClient, url: str, tmp_path: Path
):
    assert await workers(http, "tok-admin") == {}
    task = await taskmill.for_app("photos").enqueue("block-first", {})
    await put_record(taskmill, "music-box:1:abc", "music", lease=600)
    async with worker_process(url, tmp_path / "runs.log") as proc:

        async def running() -> bool:
            found = [w for w in (await workers(http, "tok-admin")).values() if w["pid"] == proc.pid]
            return len(found) == 1 and found[0]["running"] == [task.id]

        await wait_for(running, timeout=60)
        admin = await workers(http, "tok-admin")
        (mine,) = [w for w in admin.values() if w["pid"] == proc.pid]
        assert mine["alive"] is True and mine["busy"] == 1 and mine["concurrency"] == 4
        assert f":{proc.pid}:" in mine["id"]
        types = {(h["app_id"], h["task_type"]) for h in mine["handlers"]}
        assert {(None, "block-first"), (None, "steps"), (None, "record")} <= types
        assert mine["running_not_shown"] == 0
        assert datetime.fromisoformat(mine["heartbeat_at"]) <= datetime.now(UTC)
        assert 0 <= mine["heartbeat_age_seconds"] < mine["lease_seconds"]
        music_box = admin["music-box:1:abc"]
        assert music_box["handlers"][0] == {
            "task_type": "encode",
            "app_id": "music",
            "max_retries": 2,
            "timeout": None,
            "concurrency": None,
            "batch": False,
        }
        # The same as the CLI's and the page's listing: live ones first.
        assert list(admin) == [w.id for w in await taskmill.workers()]

        # photos: the worker serving every app, with photos' running task; not the
        # music-only one.
        photos = await workers(http, "tok-photos")
        assert set(photos) == {mine["id"]}
        assert photos[mine["id"]]["running"] == [task.id]
        assert all(h["app_id"] in (None, "photos") for h in photos[mine["id"]]["handlers"])

        # music: both workers, but not photos' task, and of the music box only its own
        # handlers and the host's.
        music = await workers(http, "tok-music")
        assert set(music) == {mine["id"], "music-box:1:abc"}
        assert music[mine["id"]]["running"] == []
        assert music[mine["id"]]["busy"] == 1  # the slots are the worker's own
        assert {h["task_type"] for h in music["music-box:1:abc"]["handlers"]} == {
            "encode",
            "taskmill.group",
        }

        # A worker of another app's handler only is not photos' to see.
        await put_record(taskmill, "film-box:2:def", "film", lease=600)
        assert "film-box:2:def" in await workers(http, "tok-admin")
        assert "film-box:2:def" not in await workers(http, "tok-photos")
        await taskmill.cancel(task.id)  # the worker then stops at once


async def test_a_dead_worker_is_listed_dead_until_pruned(
    taskmill: Taskmill, http: httpx.AsyncClient
):
    await put_record(taskmill, "gone:3:xyz", "music", lease=0.001)

    async def dead() -> bool:
        found = (await workers(http, "tok-admin")).get("gone:3:xyz")
        return found is not None and found["alive"] is False

    await wait_for(dead, timeout=10)
    assert (await workers(http, "tok-music"))["gone:3:xyz"]["alive"] is False


async def test_workers_take_no_query_parameter(http: httpx.AsyncClient):
    for params in ({"app_id": "photos"}, {"foo": "bar"}):
        response = await http.get("/v1/workers", params=params, headers=auth("tok-admin"))
        assert response.status_code == 422, params
        error = response.json()["error"]
        assert error["code"] == "invalid_query" and error["field"] == next(iter(params))
    assert (await http.get("/v1/workers")).status_code == 401
    assert (await http.get("/v1/workers", headers=auth("nope"))).status_code == 401


async def test_the_openapi_document_describes_the_workers_and_the_timeline(
    http: httpx.AsyncClient,
):
    document = (await http.get("/openapi.json")).json()
    listing = document["paths"]["/v1/workers"]["get"]
    assert listing["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/WorkerList"
    }
    info = document["components"]["schemas"]["WorkerInfo"]
    assert {"id", "alive", "handlers", "running", "heartbeat_at"} <= set(info["required"])
    timeline = document["paths"]["/v1/metrics/timeline"]["get"]
    assert {p["name"] for p in timeline["parameters"]} == {"app_id", "minutes"}
    assert {"200", "401", "403", "422"} <= set(timeline["responses"])
    bucket = document["components"]["schemas"]["TimelineBucket"]
    assert {"completed", "failed", "cancelled", "retried", "latency"} <= set(bucket["required"])
