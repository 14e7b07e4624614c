"""The service's metrics of the last hour (``GET /v1/metrics/timeline``) and the
dashboard's charts drawn from them, in a real headless Chromium through a real uvicorn
server, with real workers (another process, and one in this process), on SQLite and
PostgreSQL (docs/dashboard.md, "Charts"; docs/service.md, "Metrics")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Page
from taskmill import Context, Taskmill, TaskStatus
from taskmill_http import Limits, create_app

from tests.browser_support import sign_in
from tests.http_support import TOKENS, serve, wait_for
from tests.test_dashboard import worker_process

pytestmark = pytest.mark.timeout(120)
pytest_plugins = ("tests.browser_fixtures",)  # the browser and page fixtures

LIMITS = Limits(depth_sample_seconds=0.5)
"""The queue depth sampled every half second, so that a test sees it move."""


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tasks.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
async def taskmill(url: str) -> AsyncIterator[Taskmill]:
    async with Taskmill(url, plugins=False) as tm:

        @tm.handler("explode", app_id="music", max_retries=1)
        async def explode(ctx: Context, params: dict[str, Any]) -> None:
            raise RuntimeError("the amplifier caught fire")

        @tm.handler("vanish", app_id="photos", delete_completed=True)
        async def vanish(ctx: Context, params: dict[str, Any]) -> int:
            return 1

        yield tm


@pytest.fixture
async def base_url(taskmill: Taskmill) -> AsyncIterator[str]:
    async with serve(create_app(taskmill, TOKENS, limits=LIMITS)) as found:
        yield found


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        yield client


@pytest.fixture
async def in_process_worker(taskmill: Taskmill) -> AsyncIterator[None]:
    """A worker of the test's own Taskmill: it serves ``explode`` and ``vanish``."""
    worker = taskmill.worker(concurrency=4, reserved_high_priority_slots=0)
    running = asyncio.create_task(worker.run())
    try:
        yield
    finally:
        await worker.stop()
        await running


async def timeline(http: httpx.AsyncClient, token: str, **params: Any) -> dict[str, Any]:
    response = await http.get("/v1/metrics/timeline", params=params, headers=auth(token))
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def totals(found: dict[str, Any]) -> dict[str, int]:
    names = ("enqueued", "started", "completed", "failed", "cancelled", "retried")
    return {n: sum(b[n] for b in found["buckets"]) for n in names}


async def series_total(page: Page, chart: str, series: str) -> str | None:
    return await page.locator(f"#{chart} g[data-series={series}]").get_attribute("data-total")


async def test_the_charts_count_real_tasks_live_per_app(
    taskmill: Taskmill,
    base_url: str,
    http: httpx.AsyncClient,
    page: Page,
    url: str,
    tmp_path: Path,
    in_process_worker: None,
):
    await sign_in(page, base_url, "tok-admin", "/ui/")
    await page.click("nav >> text=Charts")
    await page.wait_for_url("**/ui/charts")
    assert await page.locator("nav a[aria-current=page]").inner_text() == "Charts"
    # A fresh store: nothing counted yet, and the page says so in its charts.
    for series in ("completed", "failed", "cancelled"):
        assert await series_total(page, "chart-throughput", series) == "0"
    assert totals(await timeline(http, "tok-admin")) == dict.fromkeys(
        ("enqueued", "started", "completed", "failed", "cancelled", "retried"), 0
    )
    await page.evaluate("window.__sameDocument = true")

    photos, music = taskmill.for_app("photos"), taskmill.for_app("music")
    # Three tasks of photos for the worker in another process, one cancelled, one run
    # and deleted on completion (counted from its tombstone), one of music that fails
    # after a retry.
    ran = [await photos.enqueue("record", {}) for _ in range(3)]
    doomed = await photos.enqueue("nobody.runs.this")
    await photos.cancel(doomed.id)
    vanished = await photos.enqueue("vanish")
    failing = await music.enqueue("explode")
    async with worker_process(url, tmp_path / "runs.log"):

        async def all_done() -> bool:
            found = [await taskmill.get(t.id) for t in (*ran, failing)]
            return all(t is not None and t.status.terminal for t in found) and (
                await taskmill.get(vanished.id) is None
            )

        await wait_for(all_done, timeout=60)
    failed = await taskmill.get(failing.id)
    assert failed is not None and failed.status is TaskStatus.FAILED and failed.attempts == 2

    want_admin = {
        "enqueued": 6,
        "started": 6,  # 3 record, 1 vanish, 2 attempts of explode
        "completed": 4,
        "failed": 1,
        "cancelled": 1,
        "retried": 1,
    }

    async def admin_counted() -> bool:
        return totals(await timeline(http, "tok-admin")) == want_admin

    await wait_for(admin_counted, timeout=30)
    found = await timeline(http, "tok-admin")
    assert found["app_id"] is None and found["bucket_seconds"] == 60
    assert len(found["buckets"]) == 60
    latencies = [b["latency"] for b in found["buckets"] if b["latency"]["count"]]
    # Every start's latency, but maybe the first of explode's: when the event is read
    # after the retry was scheduled, the task's snapshot has the next attempt's run_at.
    assert sum(lat["count"] for lat in latencies) in (5, 6)
    for lat in latencies:
        assert 0 <= lat["avg_seconds"] <= lat["max_seconds"] < 60
        assert lat["p95_seconds"] <= lat["max_seconds"]

    # Each app's token sees its own counts only.
    assert totals(await timeline(http, "tok-photos")) == {
        "enqueued": 5,
        "started": 4,
        "completed": 4,
        "failed": 0,
        "cancelled": 1,
        "retried": 0,
    }
    assert totals(await timeline(http, "tok-music")) == {
        "enqueued": 1,
        "started": 2,
        "completed": 0,
        "failed": 1,
        "cancelled": 0,
        "retried": 1,
    }
    # The admin picks an app; an app token cannot name another.
    assert totals(await timeline(http, "tok-admin", app_id="music"))["failed"] == 1
    other = await http.get(
        "/v1/metrics/timeline", params={"app_id": "music"}, headers=auth("tok-photos")
    )
    assert other.status_code == 403 and other.json()["error"]["code"] == "other_app"

    # The open page redrew itself with the same numbers: no reload.
    async def page_counted() -> bool:
        return (
            await series_total(page, "chart-throughput", "completed") == "4"
            and await series_total(page, "chart-throughput", "failed") == "1"
            and await series_total(page, "chart-throughput", "cancelled") == "1"
            and await series_total(page, "chart-throughput", "retried") == "1"
        )

    await wait_for(page_counted, timeout=30)
    assert await page.evaluate("window.__sameDocument") is True
    assert int(await page.evaluate("document.body.dataset.refreshes")) >= 1
    # Each bar says its number, in an attribute and in its title.
    bars = page.locator("#chart-throughput g[data-series=completed] rect")
    drawn = 0
    for index in range(await bars.count()):
        value = await bars.nth(index).get_attribute("data-value")
        title = await bars.nth(index).locator("title").text_content() or ""
        assert title.endswith(f": {value} completed")
        drawn += int(value or 0)
    assert drawn == 4
    assert await page.locator("[data-total=enqueued]").inner_text() == "6"
    heading = await page.locator("#chart-throughput > title").text_content()
    assert heading == "Throughput per minute, last 60 minutes"
    desc = await page.locator("#chart-throughput > desc").text_content() or ""
    assert "4 completed, 1 failed, 1 cancelled" in desc
    assert await page.locator("#chart-latency g[data-series=max] circle").count() >= 1

    # The queue depth: tasks nobody serves wait, sampled from the store's counts.
    for _ in range(4):
        await photos.enqueue("nobody.runs.this")

    async def depth_drawn() -> bool:
        pending = page.locator("#chart-depth g[data-series=pending]")
        return await pending.get_attribute("data-last") == "4"

    await wait_for(depth_drawn, timeout=30)
    samples = (await timeline(http, "tok-admin"))["queue_depth"]
    assert samples[-1]["pending"] == 4 and samples[-1]["running"] == 0

    # An app token's page: its own app only, and no other app to pick.
    browser = page.context.browser
    assert browser is not None
    context = await browser.new_context()
    try:
        mine = await context.new_page()
        await sign_in(mine, base_url, "tok-music", "/ui/charts")
        assert await series_total(mine, "chart-throughput", "failed") == "1"
        assert await series_total(mine, "chart-throughput", "completed") == "0"
        assert await mine.locator("#c-app").count() == 0

        async def music_depth_sampled() -> bool:
            await mine.reload()
            pending = mine.locator("#chart-depth g[data-series=pending]")
            return await pending.get_attribute("data-last") == "0"

        await wait_for(music_depth_sampled, timeout=30)  # photos' 4 pending are not its
        await mine.goto(f"{base_url}/ui/charts?app_id=photos")
        assert "403: other_app" in await mine.locator("main h1").inner_text()
        assert await mine.locator("#charts").count() == 0
    finally:
        await context.close()

    # The admin's picker shows one app's charts.
    await page.goto(f"{base_url}/ui/charts")
    await page.select_option("#c-app", "photos")
    await page.click("#charts-filter button[type=submit]")
    await page.wait_for_url("**/ui/charts?app_id=photos")
    assert await series_total(page, "chart-throughput", "completed") == "4"
    assert await series_total(page, "chart-throughput", "failed") == "0"


async def test_the_hour_before_the_service_started_is_backfilled_from_stored_tasks(
    url: str, tmp_path: Path
):
    async with Taskmill(url, plugins=False) as tm:

        @tm.handler("ok", app_id="photos")
        async def ok(ctx: Context, params: dict[str, Any]) -> int:
            return 1

        photos = tm.for_app("photos")
        done = [await photos.enqueue("ok") for _ in range(3)]
        await photos.enqueue("later", delay=3600)  # enqueued, never started
        await tm.for_app("music").enqueue("later", delay=3600)
        await tm.worker(reserved_high_priority_slots=0).run_until_idle()
        for task in done:
            stored = await tm.get(task.id)
            assert stored is not None and stored.status is TaskStatus.COMPLETED

        # The service starts after all that: its collector backfills it.
        async with (
            serve(create_app(tm, TOKENS, limits=LIMITS)) as base,
            httpx.AsyncClient(base_url=base, timeout=10) as http,
        ):

            async def backfilled() -> bool:
                found = await timeline(http, "tok-admin")
                return found["backfill"]["until"] is not None

            await wait_for(backfilled, timeout=30)
            found = await timeline(http, "tok-admin")
            assert found["backfill"] == {
                "tasks": 5,
                "capped": False,
                "until": found["backfill"]["until"],
            }
            assert totals(found) == {
                "enqueued": 5,
                "started": 3,
                "completed": 3,
                "failed": 0,
                "cancelled": 0,
                "retried": 0,  # retries are not in the stored tasks
            }
            assert sum(b["latency"]["count"] for b in found["buckets"]) == 3
            photos_counts = totals(await timeline(http, "tok-photos"))
            assert (photos_counts["enqueued"], photos_counts["completed"]) == (4, 3)
            music_counts = totals(await timeline(http, "tok-music"))
            assert (music_counts["enqueued"], music_counts["completed"]) == (1, 0)


async def test_the_timeline_takes_only_its_query_parameters(http: httpx.AsyncClient):
    for params in ({"foo": "1"}, {"minutes": "0"}, {"minutes": "x"}, {"app_id": ""}):
        response = await http.get("/v1/metrics/timeline", params=params, headers=auth("tok-admin"))
        assert response.status_code == 422, params
        assert response.json()["error"]["code"] == "invalid_query"
    short = await timeline(http, "tok-admin", minutes=5)
    assert len(short["buckets"]) == 5
    capped = await timeline(http, "tok-admin", minutes=600)
    assert len(capped["buckets"]) == 60
    assert (await http.get("/v1/metrics/timeline")).status_code == 401
