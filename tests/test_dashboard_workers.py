"""The dashboard's workers page and its flags on task types no live worker serves, in a
real headless Chromium through a real uvicorn server, with a real worker process, on
SQLite and PostgreSQL (docs/dashboard.md)."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.async_api import Page
from taskmill import Taskmill
from taskmill.workers import WorkerHandler, WorkerRecord, record_json
from taskmill_http import create_app

from tests.browser_support import sign_in
from tests.http_support import TOKENS, serve, wait_for
from tests.test_dashboard import worker_process

pytestmark = pytest.mark.timeout(120)
pytest_plugins = ("tests.browser_fixtures",)  # the browser and page fixtures


@pytest.fixture(params=["sqlite", "postgres"])
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tasks.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
async def taskmill(registry_url: str) -> AsyncIterator[Taskmill]:
    async with Taskmill(registry_url, plugins=False) as tm:
        assert tm.storage.capabilities.worker_registry
        yield tm


@pytest.fixture
async def base_url(taskmill: Taskmill) -> AsyncIterator[str]:
    async with serve(create_app(taskmill, TOKENS)) as url:
        yield url


async def put_music_worker(tm: Taskmill) -> None:
    """A registration of a worker serving only app music's ``encode``."""
    record = WorkerRecord(
        id="music-box:1:abc",
        host="music-box",
        pid=1,
        version="9.9",
        started_at=datetime.now(UTC),
        lease_seconds=600,
        concurrency=2,
        busy=0,
        handlers=(
            WorkerHandler(task_type="encode", app_id="music"),
            WorkerHandler(task_type="taskmill.group"),
        ),
    )
    await tm.storage.put_worker(record.id, record_json(record))


async def test_the_workers_page_shows_a_worker_of_another_process_live(
    taskmill: Taskmill, base_url: str, page: Page, registry_url: str, tmp_path: Path
):
    await sign_in(page, base_url, "tok-admin", "/ui/")
    await page.click("nav >> text=Workers")
    await page.wait_for_url("**/ui/workers")
    assert await page.locator("nav a[aria-current=page]").inner_text() == "Workers"
    assert "No worker is registered" in await page.locator("#workers").inner_text()
    await page.evaluate("window.__sameDocument = true")

    task = await taskmill.for_app("photos").enqueue("block-first", {})
    async with worker_process(registry_url, tmp_path / "runs.log") as proc:
        row = page.locator(f'tr[data-worker-id*=":{proc.pid}:"]')

        async def busy() -> bool:
            return (
                await row.count() == 1
                and "1 of 4" in await row.locator("[data-slots]").inner_text()
            )

        await wait_for(busy, timeout=60)  # the page refreshed itself: no reload
        assert await page.evaluate("window.__sameDocument") is True
        assert await row.get_attribute("data-alive") == "yes"
        assert await row.locator("[data-state]").inner_text() == "alive"
        assert await row.locator("[data-pid]").inner_text() == str(proc.pid)
        serves = await row.locator("[data-serves]").inner_text()
        assert "(every app)" in serves and "block-first" in serves and "steps" in serves
        link = row.locator(f'li[data-task-id="{task.id}"] a')
        assert await link.count() == 1
        assert await row.locator(f'li[data-task-id="{task.id}"] [data-status]').inner_text() == (
            "running"
        )

        # An app token sees the workers that serve its app: this one serves every app,
        # the registered music-only worker only music.
        await put_music_worker(taskmill)
        await page.reload()
        assert await page.locator('tr[data-worker-id="music-box:1:abc"]').count() == 1

        await link.click()
        await page.wait_for_url(f"**/ui/tasks/{task.id}")

        browser = page.context.browser
        assert browser is not None
        for token, sees_worker, sees_music, sees_task in (
            ("tok-photos", True, False, True),
            ("tok-music", True, True, False),  # the worker, not photos' task it runs
        ):
            context = await browser.new_context()
            try:
                other = await context.new_page()
                await sign_in(other, base_url, token, "/ui/workers")
                mine = other.locator(f'tr[data-worker-id*=":{proc.pid}:"]')
                assert await mine.count() == int(sees_worker)
                music = other.locator('tr[data-worker-id="music-box:1:abc"]')
                assert await music.count() == int(sees_music)
                running = other.locator(f'li[data-task-id="{task.id}"]')
                assert await running.count() == int(sees_task)
                if not sees_task:
                    assert "1 not shown" not in await mine.inner_text()
            finally:
                await context.close()
        await taskmill.cancel(task.id)  # the worker then stops at once


async def test_a_killed_worker_is_shown_dead(
    taskmill: Taskmill, base_url: str, page: Page, registry_url: str, tmp_path: Path
):
    async with worker_process(registry_url, tmp_path / "runs.log") as proc:
        await wait_for(lambda: _registered(taskmill), timeout=60)
        await sign_in(page, base_url, "tok-admin", "/ui/workers")
        row = page.locator(f'tr[data-worker-id*=":{proc.pid}:"]')
        assert await row.get_attribute("data-alive") == "yes"
        # Stand in for a worker that died long ago: its lease is over.
        (stored,) = await taskmill.storage.workers()
        old = stored.record.replace('"lease_seconds":30.0', '"lease_seconds":0.001')
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
        await taskmill.storage.put_worker(stored.id, old)

        async def dead() -> bool:
            return await row.get_attribute("data-alive") == "no"

        await wait_for(dead, timeout=30)
        assert await row.locator("[data-state]").inner_text() == "dead"
        assert "0 live, 1 dead" in await page.locator("#workers-h").inner_text()


async def _registered(tm: Taskmill) -> bool:
    return bool(await tm.workers())


async def test_task_types_no_live_worker_serves_are_flagged(
    taskmill: Taskmill, base_url: str, page: Page, registry_url: str, tmp_path: Path
):
    orphan = await taskmill.enqueue("nobody.runs.this")
    served = await taskmill.enqueue("record", {}, delay=3600)
    await sign_in(page, base_url, "tok-admin", "/ui/")
    flags = page.locator("#by-type [data-unserved]")
    # No worker at all: every pending type is flagged.
    assert await flags.count() == 2
    async with worker_process(registry_url, tmp_path / "runs.log"):
        await wait_for(lambda: _registered(taskmill), timeout=60)
        await page.reload()
        assert await flags.count() == 1
        row = page.locator("#by-type tr", has=page.locator("[data-unserved]"))
        assert "nobody.runs.this" in await row.inner_text()
        assert "no worker serves this type" in await row.inner_text()

        await page.goto(base_url + "/ui/tasks")
        orphan_row = page.locator(f'tr[data-task-id="{orphan.id}"]')
        served_row = page.locator(f'tr[data-task-id="{served.id}"]')
        assert await orphan_row.locator("[data-unserved]").inner_text() == (
            "no worker serves this type"
        )
        assert await served_row.locator("[data-unserved]").count() == 0

        # An app's own task of a type only the host serves is served too; one of a
        # type no one serves is flagged on that app's overview.
        await taskmill.for_app("photos").enqueue("nobody.runs.this")
        await taskmill.for_app("photos").enqueue("record", {}, delay=3600)
        browser = page.context.browser
        assert browser is not None
        context = await browser.new_context()
        try:
            photos = await context.new_page()
            await sign_in(photos, base_url, "tok-photos", "/ui/")
            flagged = photos.locator("#by-type tr", has=photos.locator("[data-unserved]"))
            assert await flagged.count() == 1
            assert "nobody.runs.this" in await flagged.inner_text()
        finally:
            await context.close()
