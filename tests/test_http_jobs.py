"""External jobs through a real uvicorn server: upsert, progress, complete, listing by
app, their events, and their time to live."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from taskmill import Taskmill
from taskmill_http import Limits, create_app

from tests.http_support import TOKENS, serve, wait_for
from tests.test_http_events import Subscription

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
    limits = Limits(external_job_ttl=0.5, max_external_jobs=5)
    async with serve(create_app(tm, TOKENS, limits=limits)) as url:
        yield url


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        yield client


async def test_a_job_is_upserted_progressed_completed_and_streamed(
    http: httpx.AsyncClient, base_url: str
):
    async with Subscription(base_url, "tok-photos") as events:
        made = await http.put(
            "/v1/external-jobs/sync-1", json={"title": "Sync", "data": {"a": 1}}, headers=PHOTOS
        )
        assert made.status_code == 200
        job = made.json()
        assert (job["job_id"], job["app_id"], job["status"]) == ("sync-1", "photos", "running")
        step = await http.post(
            "/v1/external-jobs/sync-1/progress",
            json={"done": 3, "total": 10, "message": "3 of 10"},
            headers=PHOTOS,
        )
        assert step.json()["progress"] == {"done": 3, "total": 10, "message": "3 of 10"}
        again = await http.put("/v1/external-jobs/sync-1", json={"data": {"b": 2}}, headers=PHOTOS)
        assert again.json()["data"] == {"a": 1, "b": 2} and again.json()["title"] == "Sync"
        done = await http.post(
            "/v1/external-jobs/sync-1/complete",
            json={"status": "completed", "result": {"files": 10}},
            headers=PHOTOS,
        )
        assert done.json()["status"] == "completed" and done.json()["finished_at"]
        await wait_for(lambda: len(events.of("external_job_update")) == 4)
        statuses = [m.data["status"] for m in events.of("external_job_update")]
        assert statuses == ["running", "running", "running", "completed"]
        listed = (await http.get("/v1/external-jobs", headers=PHOTOS)).json()
        assert [j["job_id"] for j in listed] == ["sync-1"]


async def test_jobs_are_per_app_and_admin_sees_them_all(http: httpx.AsyncClient):
    await http.put("/v1/external-jobs/j", json={"title": "photos j"}, headers=PHOTOS)
    await http.put("/v1/external-jobs/j", json={"title": "music j"}, headers=MUSIC)
    mine = (await http.get("/v1/external-jobs", headers=PHOTOS)).json()
    assert [j["title"] for j in mine] == ["photos j"]
    everything = (await http.get("/v1/external-jobs", headers=ADMIN)).json()
    assert {(j["app_id"], j["title"]) for j in everything} == {
        ("photos", "photos j"),
        ("music", "music j"),
    }
    unknown = await http.post("/v1/external-jobs/nope/progress", json={"done": 1}, headers=PHOTOS)
    assert unknown.status_code == 404


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/external-jobs/j/complete", {"status": "running"}),
        ("/v1/external-jobs/j/progress", {"done": "half"}),
        ("/v1/external-jobs/j/progress", {"done": 1, "total": 0}),
    ],
)
async def test_bad_job_reports_are_422(http: httpx.AsyncClient, path: str, body: Any):
    await http.put("/v1/external-jobs/j", json={}, headers=PHOTOS)
    response = await http.post(path, json=body, headers=PHOTOS)
    assert response.status_code == 422


async def test_jobs_expire_after_their_ttl_and_the_count_is_bounded(http: httpx.AsyncClient):
    for i in range(5):
        assert (await http.put(f"/v1/external-jobs/j{i}", json={}, headers=PHOTOS)).is_success
    full = await http.put("/v1/external-jobs/j5", json={}, headers=PHOTOS)
    assert full.status_code == 413
    await asyncio.sleep(0.6)  # the TTL is what this test is about
    assert (await http.get("/v1/external-jobs", headers=PHOTOS)).json() == []
    assert (await http.put("/v1/external-jobs/j5", json={}, headers=PHOTOS)).is_success
